"""Figures 1 and 2: throughput against mean latency per model and GPU count (Figure 1), per model family
(Figure 2, left, with the drain product and each family's throughput ratio to OPT) and per output length and
arrival rate, beside the effective batch (Figure 2, right).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import altair as alt
import polars as pl

from slmserve import stats
from slmserve.figures.captions import caption, ci_cols, mixed_gpus, point_notes, values
from slmserve.figures.names import (
    display_name,
    finite,
    largest_batch,
    main_workload,
    model_names,
    named,
    ok_runs,
    one_gpu,
    rate_name,
    sent_at_once,
)
from slmserve.figures.shapes import TRADEOFF, color_scale, log_ci_notes, no_data, tradeoff_chart

PAPER_FAMILIES = ("OPT", "LLaMA", "MPT", "GPT-J")
# "The same curve" (Figure 2) has no tolerance in the paper: 3% as bench/batch_control, but stricter (the whole
# CI inside 1 ± 3%, stats.equivalent, where batch_control asks stats.verdict's CI holding 1 of half-width <= 3%).
FAMILY_TOLERANCE = 0.03


# --- Figures 1 and 2: throughput/latency trade-offs ------------------------------------------------


def throughput_latency(summary: pl.DataFrame) -> tuple[alt.LayerChart, str]:
    """Figure 1: throughput (requests/s) against mean latency, one point per batch size, a curve per
    model and GPU count."""
    runs, notes = main_workload(ok_runs(summary))
    runs, order = named(runs)
    runs = finite(runs, TRADEOFF)
    gpus, kind, extra = pl.col("tp").cast(pl.String), pl.lit(""), []
    if mixed_gpus(runs):  # a curve and a marker per GPU model, never one line through two kinds of GPU
        kind, extra = pl.lit(" · ") + pl.col("gpu_model"), ["gpu_model"]
    data = runs.select(
        "model", "tp", "batch_size", "throughput_rps", "latency_mean_s", *extra, *ci_cols(runs, TRADEOFF),
        series=pl.col("model") + pl.lit(" · ") + gpus + pl.lit(" GPU") + kind,
        gpus=gpus + kind,
    )  # fmt: skip
    chart = tradeoff_chart(
        data, title="Throughput and latency trade-off (Figure 1)", label="batch_size", order=order,
        shape="gpus", shape_title="GPUs",
    )  # fmt: skip
    if extra:
        notes.append(
            "Each point's GPU model is in its marker's legend entry and tooltip; no curve joins two GPU models."
        )
    notes += [*point_notes(runs, TRADEOFF), *log_ci_notes(runs)]
    return chart, caption(summary, "Figure 1: throughput vs mean end-to-end latency, labels = batch size", notes)


def families(summary: pl.DataFrame) -> tuple[alt.LayerChart, str]:
    """Figure 2 (left): throughput against mean latency for decoder families of similar size (OPT-6.7B,
    LLaMA-7B, MPT-7B, GPT-J-6B), one curve per model, labels = batch size. Models with no measured run
    are named in the caption with their reason."""
    runs, notes = main_workload(one_gpu(ok_runs(summary)))
    runs = finite(runs, TRADEOFF)
    claim = _drain_note(runs) + _family_ratios(runs)  # Figure 2's claim, before named() relabels the models
    runs, order = named(runs)
    data = runs.select(
        "model", "batch_size", "throughput_rps", "latency_mean_s", *ci_cols(runs, TRADEOFF), series=pl.col("model")
    )
    chart = tradeoff_chart(data, title="Families of similar size (Figure 2, left)", label="batch_size", order=order)
    notes += [*point_notes(runs, TRADEOFF), *log_ci_notes(runs), *claim]
    if "family" in summary.columns:
        missing = [f for f in PAPER_FAMILIES if f not in set(summary["family"].drop_nulls().to_list())]
        notes += [f"{f}: no run in this summary (in the paper's Figure 2, left)" for f in missing]
    notes.append("One GPU (tp = 1), all requests at once; the paper's curves are on one A100 40 GB.")
    return chart, caption(
        one_gpu(summary), "Figure 2 (left): throughput vs mean latency per model family, labels = batch size", notes
    )


def _drain_note(runs: pl.DataFrame) -> list[str]:
    """Why the models' points agree in the throughput-latency plane: with all ``n`` requests sent at once,
    ``drain = throughput_rps * latency_mean_s / (n / 2)`` (``n`` = the point's ``n_ok``) is close to 1 while the
    batch is small against ``n`` (Little's law over the drain: on average n/2 requests are in the system) and
    grows with the batch, whatever the model. Per batch that at least two models measured: its range across
    them, and the largest spread (highest / lowest - 1)."""
    need = {"n_ok", "arrival_rate", "throughput_rps", "latency_mean_s"}
    if runs.is_empty() or not need <= set(runs.columns):
        return []
    at_once = runs.filter(sent_at_once() & (pl.col("n_ok") > 0))
    drain = (pl.col("throughput_rps") * pl.col("latency_mean_s") / (pl.col("n_ok") / 2)).alias("drain")
    per = (at_once.with_columns(drain).group_by("batch_size")
           .agg(lo=pl.col("drain").min(), hi=pl.col("drain").max(), k=pl.col("model").n_unique())
           .filter(pl.col("k") >= 2).sort("batch_size"))  # fmt: skip
    if per.is_empty():
        return []
    said = ", ".join(f"b={b} {lo:.3f}-{hi:.3f}" for b, lo, hi in per.select("batch_size", "lo", "hi").iter_rows())
    spread = (per["hi"] / per["lo"]).max() - 1
    return [
        "Throughput × mean latency / (n/2), n requests sent at once (Little's law over the drain: about 1 while the "
        f"batch is small against n, whatever the model), per batch across the models: {said}; largest spread "
        f"{spread:.1%}. So at each batch every model's point lies on one hyperbola, throughput = drain × (n/2) / "
        "latency, a faster model's further along it: the curves agree by construction of the workload; the ratios "
        "at equal batch tell the models apart."
    ]


def _ci_groups(lo: float, hi: float, tolerance: float) -> list[str]:
    """The groups of :func:`_family_ratios` a ratio's CI ``[lo, hi]`` belongs to."""
    groups = [what for what, holds in (("inside", stats.equivalent(lo, hi, tolerance)),
                                       ("excludes", stats.verdict(lo, hi, tolerance) == "differ"),
                                       ("beyond", stats.beyond(lo, hi, tolerance))) if holds]  # fmt: skip
    return groups or ["inconclusive"]


def _family_ratios(runs: pl.DataFrame, tolerance: float = FAMILY_TOLERANCE) -> list[str]:
    """Figure 2's claim (the families follow one curve) as numbers: each other family's throughput over the
    OPT model's at each batch both measured on one GPU model, the ratio of means with its 95% CI
    (:func:`slmserve.stats.ratio_ci_of`), grouped by what that CI shows: inside ``1 ± tolerance``
    (:func:`slmserve.stats.equivalent`), excluding 1 (a resolved difference; it can also be inside), wholly
    beyond ``1 ± tolerance`` (:func:`slmserve.stats.beyond`; it also excludes 1), or none of these
    (inconclusive); a point of one repeat has no CI."""
    if runs.is_empty() or not {"family", "gpu_model"} <= set(runs.columns):
        return []
    names = model_names(runs)
    # finite types an all-null column (no family known) as Float64
    refs = sorted(set(runs.filter(pl.col("family").cast(pl.String) == "OPT")["model"].to_list()))
    if len(refs) != 1:
        said = ", ".join(names[m][0] for m in refs)
        return [f"No ratios between families: {len(refs)} OPT curves ({said}), no one reference."] if refs else []
    ref = {(r["batch_size"], r["gpu_model"]): r for r in runs.filter(pl.col("model") == refs[0]).iter_rows(named=True)}
    per = []
    for (model,), group in runs.filter(pl.col("model") != refs[0]).group_by("model", maintain_order=True):
        said, shown = [], {"inside": [], "excludes": [], "beyond": [], "inconclusive": []}
        for r in group.sort("batch_size").iter_rows(named=True):
            other = ref.get((r["batch_size"], r["gpu_model"]))
            if other is None:
                continue  # no OPT point at this batch and GPU model
            g = stats.ratio_ci_of(stats.summary_sample(r), stats.summary_sample(other))
            if g["ratio"] is None:
                continue  # OPT's throughput is 0
            b = r["batch_size"]
            if g["ci_lo"] is None:
                said.append(f"b={b} {g['ratio']:.3f} (no CI)")
                continue
            said.append(f"b={b} {g['ratio']:.3f} [{g['ci_lo']:.3f}, {g['ci_hi']:.3f}]")
            for what in _ci_groups(g["ci_lo"], g["ci_hi"], tolerance):
                shown[what].append(str(b))
        if not said:
            per.append(f"{names[model][0]}: no batch measured for both on one GPU model")
            continue
        labels = {"inside": f"CI inside 1 ± {tolerance:.0%}", "excludes": "CI excludes 1",
                  "beyond": f"CI beyond 1 ± {tolerance:.0%} (a difference larger than {tolerance:.0%})",
                  "inconclusive": f"inconclusive (CI holds 1 and reaches past 1 ± {tolerance:.0%})"}  # fmt: skip
        groups = [f"{labels[what]} at b={', '.join(batches)}" for what, batches in shown.items() if batches]
        per.append(f"{names[model][0]}: {', '.join(said)}" + (f" ({'; '.join(groups)})" if groups else ""))
    return [
        f"Throughput over {names[refs[0]][0]}'s at the same batch and GPU model (ratio of means, 95% CI by the "
        "delta method). A point's repeats can come from several machines: a resolved difference smaller than the "
        f"machines' spread (calibration table) can be theirs, not the model's. {'; '.join(per)}."
    ]


def _output_model(summary: pl.DataFrame) -> str | None:
    """The model of the output-length experiment: the one with the most distinct output lengths measured."""
    runs = ok_runs(summary) if not ok_runs(summary).is_empty() else summary
    if runs.is_empty():
        return None
    counts = (
        runs.group_by("model").agg(n=pl.col("output_len").n_unique()).sort(["n", "model"], descending=[True, False])
    )
    return counts["model"][0]


def output_lengths(summary: pl.DataFrame, model: str | None = None) -> tuple[alt.HConcatChart, str]:
    """Figure 2 (right): OPT-6.7B throughput against mean latency, a series per arrival rate (inf, 100,
    10 req/s), points labelled by output length (32-256); beside it the mechanism: the effective batch
    (time-averaged running requests, vLLM's gauge) per output length, under the one batch every point
    runs at (``--max-num-seqs`` = the one-GPU maximum, dashed). A summary with several batches per point
    (a sweep) is reduced to the largest, preferring runs without preemption."""
    model = model or _output_model(summary)
    frame = one_gpu(summary.filter(pl.col("model") == model)) if model else summary.head(0)
    runs = largest_batch(ok_runs(frame), ["arrival_rate", "output_len"]) if not frame.is_empty() else frame
    runs, _ = named(runs)
    runs = finite(runs, TRADEOFF).sort(["arrival_rate", "output_len"], descending=[True, False])
    rates = runs["arrival_rate"].cast(pl.Float64).unique().sort(descending=True).to_list() if runs.height else []
    order = [rate_name(r) for r in rates]
    data = runs.select(
        "model", "output_len", "batch_size", "throughput_rps", "latency_mean_s",
        *ci_cols(runs, [*TRADEOFF, "effective_batch"]),
        effective_batch=_float_or_null(runs, "effective_batch"), preemptions=_float_or_null(runs, "preemptions"),
        rate=pl.col("arrival_rate").cast(pl.Float64).map_elements(rate_name, return_dtype=pl.String),
    ).with_columns(series=pl.col("rate"))  # fmt: skip
    left = tradeoff_chart(
        data, title="Throughput vs latency, labels = output length", label="output_len", order=order, color="rate",
        color_title="Arrival rate (req/s)", log_x=False,
    )  # fmt: skip
    chart = alt.hconcat(left, _effective_batch_panel(data, order)).properties(
        title=f"Output length and arrival rate, {display_name(model or '')} (Figure 2, right)"
    )
    notes = [
        "Arrival times from a Poisson process at the given rate (inf: all requests at once), as in the paper.",
        *_output_batch_notes(runs), *point_notes(runs, [*TRADEOFF, "effective_batch"], _outlen_point),
    ]  # fmt: skip
    what = "Figure 2 (right): throughput vs mean latency by output length (labels) and arrival rate; effective batch"
    return chart, caption(frame, what, notes)


def _float_or_null(runs: pl.DataFrame, col: str) -> pl.Expr:
    return pl.col(col).cast(pl.Float64) if col in runs.columns else pl.lit(None, pl.Float64)


def _outlen_point(row: Mapping[str, Any]) -> str:
    return f"{row['output_len']} tokens at {rate_name(row.get('arrival_rate'))} req/s"


def _effective_batch_panel(data: pl.DataFrame, order: Sequence[str]) -> alt.LayerChart:
    """Effective batch against output length (log2 axis), a line per arrival rate, error bars its 95% CI over
    repeats where the data has one; dashed: the batch limit."""
    lens = sorted(set(data["output_len"].to_list()))
    title = "Effective batch (mean running requests)"
    x = alt.X("output_len:Q", title="Output length (tokens)", scale=alt.Scale(type="log", base=2),
              axis=alt.Axis(values=lens, format="d") if lens else alt.Axis(format="d"))  # fmt: skip
    base = alt.Chart(data).encode(x=x, color=color_scale(order, "rate", "Arrival rate (req/s)"))
    measured = base.transform_filter("isValid(datum.effective_batch)").encode(y=alt.Y("effective_batch:Q", title=title))
    errors = base.mark_rule(strokeWidth=1.5).encode(y=alt.Y("effective_batch_ci_lo:Q", title=title),
                                                     y2="effective_batch_ci_hi:Q")  # fmt: skip
    layers = [
        alt.Chart(data).mark_rule(strokeDash=[4, 4], color="gray").encode(y=alt.Y("batch_size:Q", title=title)),
        measured.mark_line().encode(detail="series:N", order="output_len:Q"),
        measured.mark_point(filled=True, size=50).encode(tooltip=["rate", "output_len", "batch_size", "effective_batch",
                                                                  "preemptions"]),
        errors.transform_filter("isValid(datum.effective_batch_ci_lo)"),
    ]  # fmt: skip
    if data["effective_batch"].is_null().all():
        layers.append(no_data())
    return alt.layer(*layers, title="Effective batch (dashed: --max-num-seqs)")


def _output_batch_notes(runs: pl.DataFrame) -> list[str]:
    """The batch every point ran at and the effective batch per point (the right panel)."""
    batches = values(runs, "batch_size")
    if len(batches) == 1:
        notes = [
            f"One batch for every point: vLLM started with --max-num-seqs = {batches[0]} (the one-GPU maximum of "
            "the KV-cache probe); the paper let vLLM batch as many requests as the KV cache holds."
        ]
    else:
        per = "; ".join(f"{_outlen_point(r)}: {r['batch_size']}" for r in runs.iter_rows(named=True))
        notes = [f"Batch (--max-num-seqs) per point, the largest measured, runs known to be without preemption "
                 f"preferred (an unknown count is not): {per or 'none'}."]  # fmt: skip
    if "effective_batch" not in runs.columns or runs["effective_batch"].is_null().all():
        return [*notes, "Effective batch: not recorded in this summary (right panel empty)."]
    per = "; ".join(
        f"{_outlen_point(r)}: {r['effective_batch']:.1f}{_gauge_samples(r)}" for r in runs.iter_rows(named=True)
        if r["effective_batch"] is not None
    )  # fmt: skip
    effective = (
        "Effective batch (right panel) = time average of vLLM's running-requests gauge (/metrics, polled at 1 Hz) "
        "over the run: the batch vLLM actually ran, per point (mean over repeats; in brackets the fewest gauge "
        f"samples a repeat averaged, where recorded): {per}."
    )
    return [*notes, effective]


def _gauge_samples(row: Mapping[str, Any]) -> str:
    """`` (3 samples)``: the fewest running-gauge samples behind a point's effective batch; empty if unknown."""
    n = row.get("gauge_samples")
    return "" if n is None else f" ({n} sample{'s' * (n != 1)})"
