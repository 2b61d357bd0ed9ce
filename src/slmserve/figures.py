"""Figures: altair charts from summary parquets, with one shared theme and caption.

Every figure function takes a summary frame and returns ``(chart, caption)``; :func:`save` writes PNG
and SVG (vl-convert), a self-contained HTML and the caption as Markdown.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import altair as alt
import polars as pl

from slmserve import io

PAPER = "the paper (vLLM 0.1.7, A100 40 GB, real OPT weights)"


def theme() -> dict:
    return {
        "config": {
            "font": "DejaVu Sans",
            "view": {"continuousWidth": 420, "continuousHeight": 300},
            "axis": {"labelFontSize": 11, "titleFontSize": 12, "grid": True},
            "legend": {"labelFontSize": 11, "titleFontSize": 12},
        }
    }


alt.theme.register("slmserve", enable=True)(theme)


def ok_runs(summary: pl.DataFrame) -> pl.DataFrame:
    return summary.filter(pl.col("status") == "ok")


def caption(summary: pl.DataFrame, what: str, notes: list[str] | None = None) -> str:
    """What was measured where: GPU, engine and version, request counts, differences from the paper."""
    ok = ok_runs(summary)
    gpus = ", ".join(sorted(set(summary["gpu_model"].drop_nulls().to_list()))) or "unknown"
    engines = ", ".join(sorted({f"{e} {v}" for e, v in zip(summary["engine"], summary["engine_version"], strict=True)}))
    counts = sorted(set(ok["n_ok"].to_list())) if "n_ok" in ok.columns else []
    infeasible = summary.filter(pl.col("status") == "infeasible")
    lines = [
        f"**{what}**",
        "",
        f"- Hardware: {gpus}",
        f"- Engine: {engines}; dummy weights of the real shapes (`--load-format dummy`), `ignore_eos`, temperature 0",
        f"- Requests per point: {', '.join(map(str, counts)) or 'none'}; "
        f"prompt/output tokens: {sorted(set(summary['input_len'].to_list()))}/"
        f"{sorted(set(summary['output_len'].to_list()))}",
        f"- Runs: {ok.height} measured, {infeasible.height} infeasible (batch does not fit the KV cache)",
        f"- Differs from {PAPER}: engine version, GPU, random weights.",
    ]
    return "\n".join(lines + [f"- {n}" for n in (notes or [])]) + "\n"


def throughput_latency(summary: pl.DataFrame) -> tuple[alt.Chart, str]:
    """Figure 1: throughput (requests/s) against mean latency, one point per batch size, a curve per
    model and GPU count."""
    data = ok_runs(summary).select(
        "model", "tp", "batch_size", "throughput_rps", "latency_mean_s",
        series=pl.col("model") + pl.lit(" · ") + pl.col("tp").cast(pl.String) + pl.lit(" GPU"),
        gpus=pl.col("tp").cast(pl.String),
    )  # fmt: skip
    base = alt.Chart(data).encode(
        x=alt.X("latency_mean_s:Q", title="Mean end-to-end latency (s)", scale=alt.Scale(type="log")),
        y=alt.Y("throughput_rps:Q", title="Throughput (requests/s)"),
        color=alt.Color("model:N", title="Model"),
    )
    lines = base.mark_line().encode(
        detail="series:N", order="batch_size:Q", strokeDash=alt.StrokeDash("gpus:N", legend=None)
    )
    points = base.mark_point(filled=True, size=50).encode(
        shape=alt.Shape("gpus:N", title="GPUs"),
        tooltip=["model", "tp", "batch_size", "throughput_rps", "latency_mean_s"],
    )
    labels = base.mark_text(dy=-9, fontSize=9).encode(text="batch_size:Q")
    chart = (lines + points + labels).properties(title="Throughput and latency trade-off (Figure 1)")
    return chart, caption(summary, "Figure 1: throughput vs mean end-to-end latency, labels = batch size")


FIGURES: dict[str, Callable[[pl.DataFrame], tuple[alt.Chart, str]]] = {
    "throughput_latency": throughput_latency,
}


def save(chart: alt.TopLevelMixin, caption_md: str, stem: str | os.PathLike[str]) -> list[Path]:
    """Write ``stem.png``, ``stem.svg``, ``stem.html`` (self-contained) and ``stem.caption.md``."""
    import vl_convert as vlc

    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    spec = chart.to_json()
    png = vlc.vegalite_to_png(spec, scale=2)
    svg = vlc.vegalite_to_svg(spec)
    html = vlc.vegalite_to_html(spec, bundle=True)
    out = []
    for ext, data in (
        (".png", png),
        (".svg", svg.encode()),
        (".html", html.encode()),
        (".caption.md", caption_md.encode()),
    ):
        path = stem.with_name(stem.name + ext)
        io.atomic_write_bytes(path, data)
        out.append(path)
    return out
