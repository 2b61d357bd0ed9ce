"""Figures: altair charts from summary parquets, with one shared theme and caption.

Every figure function takes a summary frame and returns ``(chart, caption)``; :func:`save` writes PNG
and SVG (vl-convert), a self-contained HTML and the caption as Markdown. Which functions are figures, and
the summary each reads, is :data:`slmserve.layout.FIGURES`. :func:`caption` is shared by all figures.

Three chart shapes are shared by the paper's figures: a throughput/latency trade-off (:func:`_tradeoff`,
Figures 1, 2 and 5), lines against a log2 batch-size axis (:func:`_batch_lines`, Figures 3 and 8), and
bars per model, grouped by replicas where given (:func:`_bars`, Figures 4, 6 and 7). Plotted data are
selected column by column, with nulls and non-finite values dropped, so a spec never carries inf/NaN
(CPU runs have no GPU telemetry: those figures render empty and say so in the caption).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import altair as alt
import polars as pl

from slmserve import io, stats
from slmserve.analysis import CI_METRICS, ENERGY_MIN_WINDOW_S, NOT_MEASURED, complete
from slmserve.config import rate_label

PAPER = "the paper (vLLM 0.1.7, A100 40 GB, real OPT weights)"
NOT_MEASURED_NOTE = "not measured yet (no result file)"
# How the paper names its model families (Figure 2 left), keyed by the prefix of a config model key.
FAMILY_NAMES = {"opt": "OPT", "llama": "LLaMA", "mpt": "MPT", "gptj": "GPT-J", "gpt-j": "GPT-J"}
PAPER_FAMILIES = ("OPT", "LLaMA", "MPT", "GPT-J")
# "The same curve" (Figure 2) has no tolerance in the paper: 3% as bench/batch_control, but stricter (the whole
# CI inside 1 ± 3%, stats.equivalent, where batch_control asks stats.verdict's CI holding 1 of half-width <= 3%).
FAMILY_TOLERANCE = 0.03
TELEMETRY_SOURCE = "GPU metrics: NVML, sampled every 100 ms over each run's measurement window (the paper: DCGM)"


def theme() -> dict:
    return {
        "config": {
            "font": "DejaVu Sans",
            "view": {"continuousWidth": 420, "continuousHeight": 300},
            "axis": {"labelFontSize": 11, "titleFontSize": 12, "grid": True},
            "legend": {"labelFontSize": 11, "titleFontSize": 12},
            "title": {"fontSize": 14},
        }
    }


alt.theme.register("slmserve", enable=True)(theme)


# --- model names and order ------------------------------------------------------------------------


def _params_value(text: str | None) -> float:
    """``"125M"`` -> 1.25e8, ``"opt1.3b"`` -> 1.3e9; inf when no size is found (sorted last)."""
    m = re.search(r"(\d+(?:\.\d+)?)\s*([mb])", (text or "").lower())
    return float(m[1]) * (1e6 if m[2] == "m" else 1e9) if m else math.inf


def display_name(model: str, family: str | None = None, params: str | None = None) -> str:
    """The paper's name of a model: ``OPT-1.3B``, ``LLaMA-7B``, ``GPT-J-6B`` (from family and params,
    else from a config key such as ``opt1.3b``); the key itself when neither works."""
    if family and params:
        return f"{family}-{params}"
    m = re.fullmatch(r"([a-z-]+?)-?(\d+(?:\.\d+)?[mb])", model.lower())
    if m:
        return f"{FAMILY_NAMES.get(m[1], m[1].upper())}-{(params or m[2]).upper()}"
    return model


def model_names(df: pl.DataFrame) -> dict[str, tuple[str, float]]:
    """Config model key -> (display name, parameter count)."""
    if "model" not in df.columns:
        return {}
    cols = [c for c in ("model", "family", "params") if c in df.columns]
    out: dict[str, tuple[str, float]] = {}
    for row in df.select(cols).unique(maintain_order=True).iter_rows(named=True):
        key, family, params = row["model"], row.get("family"), row.get("params")
        if key is None or (key in out and not family):
            continue
        out[key] = (display_name(key, family, params), _params_value(params or key))
    return out


def named(df: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """``df`` with ``model`` replaced by the display name, and the names ordered by model size."""
    names = model_names(df)
    if not names:
        return df, []
    order = [name for name, _ in sorted(set(names.values()), key=lambda t: (t[1], t[0]))]
    mapping = {k: v[0] for k, v in names.items()}
    return df.with_columns(pl.col("model").cast(pl.String).replace(mapping)), order


# --- run selection --------------------------------------------------------------------------------


def ok_runs(summary: pl.DataFrame) -> pl.DataFrame:
    summary = complete(summary)
    return summary.filter(pl.col("status") == "ok") if "status" in summary.columns else summary


def _finite(df: pl.DataFrame, cols: Iterable[str]) -> pl.DataFrame:
    """Rows where every column of ``cols`` is present, non-null and (for floats) finite. All-null columns
    (dtype Null, as in a frame of CPU runs) become Float64, so that altair can type them."""
    df = df.with_columns(pl.col(c).cast(pl.Float64) for c, t in df.schema.items() if t == pl.Null)
    conds = []
    for c in cols:
        if c not in df.columns:
            return df.head(0)
        cond = pl.col(c).is_not_null()
        if df.schema[c].is_float():
            cond = cond & pl.col(c).is_finite()
        conds.append(cond)
    return df.filter(*conds) if conds else df


def _one_gpu(summary: pl.DataFrame) -> pl.DataFrame:
    return summary.filter(pl.col("tp") == 1) if "tp" in summary.columns else summary


def _at_once() -> pl.Expr:
    """Rows whose requests were all sent at once: arrival rate inf (or not recorded)."""
    rate = pl.col("arrival_rate").cast(pl.Float64)
    return rate.is_null() | rate.is_infinite()


def main_workload(runs: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """The batch-sweep workload: all requests at once (arrival rate inf) and, when several output lengths
    are present, the longest (the paper's 256). Returns the rows and a note on what was left out."""
    n = runs.height
    if "arrival_rate" in runs.columns and n and runs.select(_at_once().any()).item():
        runs = runs.filter(_at_once())
    out = None
    if "output_len" in runs.columns and runs["output_len"].n_unique() > 1:
        out = runs["output_len"].max()
        runs = runs.filter(pl.col("output_len") == out)
    if runs.height == n:
        return runs, []
    what = f"all-at-once runs with {out} output tokens" if out is not None else "all-at-once runs"
    return runs, [f"Only the {what} are plotted; {n - runs.height} runs of other workloads are left out."]


def _no_preemption() -> pl.Expr:
    """True where a run's preemption count is known to be 0; false where vLLM preempted or the count is unknown
    (null: a repeat's /metrics read failed, :func:`slmserve.analysis.points`)."""
    return (pl.col("preemptions") == 0).fill_null(False)


def _largest_batch(runs: pl.DataFrame, by: Sequence[str]) -> pl.DataFrame:
    """Per group of ``by``: the run with the largest batch among those known to run without preemptions
    (:func:`_no_preemption`); a group with none of those gets its largest batch."""
    clean = _no_preemption() if "preemptions" in runs.columns else pl.lit(False)
    return (
        runs.with_columns(_clean=clean)
        .sort(["_clean", "batch_size"], descending=[True, True])
        .group_by(list(by), maintain_order=True)
        .first()
        .drop("_clean")
    )


def _rate_label(rate: float | None) -> str:
    return rate_label(math.inf if rate is None else rate)


# --- caption --------------------------------------------------------------------------------------


def values(df: pl.DataFrame, col: str) -> list:
    """The distinct non-null values of ``col``, sorted (none if the column is absent)."""
    return sorted(set(df[col].drop_nulls().to_list())) if col in df.columns else []


def _not_served(summary: pl.DataFrame) -> list[str]:
    """``<model>: not served: <reason>`` for each model with no measured run."""
    if "model" not in summary.columns or "status" not in summary.columns:
        return []
    names = model_names(summary)
    lines = []
    for key in sorted(names, key=lambda k: (names[k][1], names[k][0])):
        rows = summary.filter(pl.col("model") == key)
        if (rows["status"] == "ok").any():
            continue
        missing = rows.filter(pl.col("status") == NOT_MEASURED).height
        rows = rows.filter(pl.col("status") != NOT_MEASURED)
        if rows.is_empty():
            lines.append(f"{names[key][0]}: {NOT_MEASURED_NOTE}")
            continue
        reasons = rows["reason"].drop_nulls().unique(maintain_order=True).to_list() if "reason" in rows.columns else []
        more = f" (and {len(reasons) - 2} more)" if len(reasons) > 2 else ""
        why = "; ".join(reasons[:2]) + more or ", ".join(rows["status"].drop_nulls().unique().to_list()) or "no run"
        if missing:  # the campaign is not finished: the runs still missing may be measured
            lines.append(f"{names[key][0]}: none measured yet ({rows.height} not measurable: {why}; "
                         f"{missing} not measured yet)")  # fmt: skip
        else:
            lines.append(f"{names[key][0]}: not served: {why}")
    return lines


def _telemetry_note(summary: pl.DataFrame, cols: Sequence[str]) -> list[str]:
    if not cols:
        return []
    ok = ok_runs(summary)
    cpu = bool(values(summary, "gpu_model")) and all(g.startswith("CPU") for g in values(summary, "gpu_model"))
    present = [c for c in cols if c in ok.columns and ok[c].is_not_null().any()]
    if not present:
        why = "CPU engine" if cpu else f"{', '.join(cols)} null in every run"
        return [f"GPU metrics not plotted: no GPU telemetry ({why})."]
    notes = [TELEMETRY_SOURCE + "."]
    missing = [c for c in cols if c not in present]
    if missing:
        notes.append(f"No data for {', '.join(missing)} (null in every run).")
    n_with = ok.filter(pl.any_horizontal(pl.col(c).is_not_null() for c in present)).height
    if n_with < ok.height:
        notes.append(f"GPU telemetry missing for {ok.height - n_with} of {ok.height} measured runs (not plotted).")
    return notes


def _per_model(summary: pl.DataFrame, column: str) -> list[tuple[str, Any]]:
    """(model display name, value) for each model with a value in ``column`` (none if the column is absent)."""
    if column not in summary.columns:
        return []
    names = model_names(summary)
    rows = summary.filter(pl.col(column).is_not_null())
    return [
        (names.get(key, (key,))[0], value) for key, value in sorted(set(zip(rows["model"], rows[column], strict=True)))
    ]


def caption(summary: pl.DataFrame, what: str, notes: list[str] | None = None, telemetry: Sequence[str] = ()) -> str:
    """``what`` in bold, then one item per part: hardware, engine, requests, workload, runs, batch notes,
    folded prompt ids, engine arguments, models not served, GPU telemetry (``telemetry``: the plotted
    telemetry columns), what differs from the paper, then ``notes``. A part whose columns the frame lacks
    (the replication summary has no batch size) is left out."""
    ok = ok_runs(summary)
    parts = [
        _hardware_line(summary), _engine_line(summary), _requests_line(summary, ok), _workload_line(summary),
        _runs_line(summary, ok), _batch_notes(summary, ok), _folded_ids(summary), _engine_args(summary),
        _not_served(summary), _telemetry_note(summary, telemetry),
        _paper_difference(), notes or [],
    ]  # fmt: skip
    return "\n".join([f"**{what}**", "", *(f"- {item}" for part in parts for item in part)]) + "\n"


def hardware(df: pl.DataFrame) -> str:
    """The GPU models of the frame's runs (``CPU: <model>`` on the CPU engine)."""
    return ", ".join(values(df, "gpu_model")) or "unknown"


def engines(df: pl.DataFrame) -> list[str]:
    """``<engine> <version>`` of the frame's runs, sorted."""
    if "engine" not in df.columns:
        return []
    version = df["engine_version"] if "engine_version" in df.columns else pl.Series([None] * df.height)
    return sorted({f"{e} {v}" if v else e for e, v in zip(df["engine"], version, strict=True) if e})


def _hardware_line(summary: pl.DataFrame) -> list[str]:
    """The GPU models; where the measured points ran on more than one, which models ran on which; where they
    ran on more than one set of GPU ids (a multi-GPU host), the ids of each model and GPU count."""
    ok, lines = ok_runs(summary), [f"Hardware: {hardware(summary)}"]
    if "model" not in ok.columns:
        return lines
    names = model_names(summary)
    if mixed_gpus(ok):
        where = "; ".join(f"{gpu}: {what}" for gpu, what in _who(ok, "gpu_model", names))
        lines = [f"Hardware: **mixed GPU models**, which model ran on which: {where}"]
    if len([ids for ids in values(ok, "gpu_ids") if ids]) > 1:
        ids = "; ".join(f"{i}: {what}" for i, what in _who(ok, "gpu_ids", names))
        lines.append(f"GPU ids (the `CUDA_VISIBLE_DEVICES` each job held): {ids}")
        lines += _unrecorded_beside_line(ok, names)  # on a host of several GPUs a job may have had company
    return lines + _beside_line(ok, names)


def _unrecorded_beside_line(ok: pl.DataFrame, names: Mapping[str, tuple[str, float]]) -> list[str]:
    """The measured points whose files predate the ``beside`` record: whether other GPU jobs ran beside
    them is not known from the results (a reader would otherwise take them as measured alone)."""
    if "n_beside" not in ok.columns:
        return []
    unrecorded = ok.filter(pl.col("n_beside").is_null())
    if not unrecorded.height:
        return []
    what = _models_in(unrecorded, names, _several_tp(ok))
    return [f"No record of other GPU jobs beside them (measured before results recorded it): {what}"]


def _beside_line(ok: pl.DataFrame, names: Mapping[str, tuple[str, float]]) -> list[str]:
    """Which points were measured while other GPU jobs ran on the same host (their ``n_beside`` repeats of
    the repeats that recorded it), at which batch sizes and beside which jobs: they share the host's CPUs,
    memory and power, which moves a host-bound model's numbers."""
    if "n_beside" not in ok.columns or not ok.filter(pl.col("n_beside") > 0).height:
        return []
    keys = [k for k in ("model", "tp", "replicas", "plan", "mps") if k in ok.columns]
    parts = []
    for _, rows in ok.filter(pl.col("n_beside").is_not_null()).sort(keys).group_by(keys, maintain_order=True):
        hit = rows.filter(pl.col("n_beside") > 0)
        if not hit.height:
            continue
        r = rows.row(0, named=True)
        what = _model_on(r, names, r.get("tp") is not None)
        what += f" x{r['replicas']}" if r.get("replicas") is not None else ""
        what += f" ({r['plan']}{', MPS' if r.get('mps') else ''})" if r.get("plan") == "advisor" else ""
        if "batch_size" in hit.columns and hit["batch_size"].is_not_null().all():
            what += " at b=" + ", ".join(map(str, sorted(set(hit["batch_size"].to_list()))))
        total = rows["n_repeats"].sum() if "n_repeats" in rows.columns else None
        count = f"{hit['n_beside'].sum()} of {total} repeats" if total else f"{hit['n_beside'].sum()} repeats"
        jobs = sorted({j for t in hit["beside"].drop_nulls() for j in t.split("; ") if j})  # union over points
        parts.append(f"{what}: {count}, beside {', '.join(jobs)}")
    return [
        "Measured while other GPU jobs of the workflow ran on the same host (sharing its CPUs, memory and power; "
        "a host-bound model is slowed by them): " + "; ".join(parts)
    ]


def _who(ok: pl.DataFrame, col: str, names: Mapping[str, tuple[str, float]]) -> list[tuple[str, str]]:
    """For each value of ``col``: the models (with their GPU count where the frame has several) it measured."""
    tp = _several_tp(ok)
    groups = ok.filter(pl.col(col).is_not_null()).sort(col).group_by(col, maintain_order=True)
    return [(str(value), _models_in(rows, names, tp)) for (value,), rows in groups]


def _several_tp(ok: pl.DataFrame) -> bool:
    """Whether the frame holds more than one GPU count (then each model is named with its count)."""
    return "tp" in ok.columns and len(values(ok, "tp")) > 1


def _models_in(rows: pl.DataFrame, names: Mapping[str, tuple[str, float]], tp: bool) -> str:
    """The models of ``rows``, each once and sorted, with their GPU count when ``tp``."""
    keys = rows.select("model", *(["tp"] if tp else [])).unique().sort(pl.all())
    return ", ".join(_model_on(r, names, tp) for r in keys.iter_rows(named=True))


def _model_on(row: Mapping[str, Any], names: Mapping[str, tuple[str, float]], gpus: bool) -> str:
    """The model's display name, with ``on <tp> GPU(s)`` when ``gpus``."""
    name = names.get(row["model"], (row["model"],))[0]
    return name + (f" on {row['tp']} GPU" + "s" * (row["tp"] > 1) if gpus else "")


def mixed_gpus(runs: pl.DataFrame) -> bool:
    """Whether the runs were measured on more than one GPU model."""
    return len(values(runs, "gpu_model")) > 1


def _engine_line(summary: pl.DataFrame) -> list[str]:
    if "engine" not in summary.columns:
        return []
    return [
        f"Engine: {', '.join(engines(summary)) or 'unknown'}; dummy weights of the real shapes "
        "(`--load-format dummy`), `ignore_eos`, temperature 0"
    ]


def _requests_line(summary: pl.DataFrame, ok: pl.DataFrame) -> list[str]:
    """Requests per point: the largest count (num_requests), then each batch size that measured fewer
    (workload.rounds_per_batch), by model where models differ there (a model's own, models.<name>.workload)."""
    if "n_ok" not in summary.columns:
        return []
    counts = values(ok, "n_ok")
    if len(counts) < 2 or not {"model", "batch_size"} <= set(ok.columns):
        return [f"Requests per point: {', '.join(map(str, counts)) or 'none'}"]
    full = counts[-1]
    names = model_names(ok)
    points = ok.select("model", "batch_size", "n_ok").drop_nulls().unique()
    fewer = []
    for (batch,), at in points.sort("batch_size").group_by("batch_size", maintain_order=True):
        if at["n_ok"].n_unique() == 1:
            if at["n_ok"][0] != full:
                fewer.append(f"b={batch}: {at['n_ok'][0]}")
            continue
        fewer += [
            f"{names.get(model, (model,))[0]} b={batch}: {n}"
            for model, _, n in at.filter(pl.col("n_ok") != full).sort("model", "n_ok").iter_rows()
        ]
    return [f"Requests per point: {full}" + (f", except {'; '.join(fewer)}" if fewer else "")]


def _workload_line(summary: pl.DataFrame) -> list[str]:
    cols = summary.columns
    workload = []
    if "input_len" in cols and "output_len" in cols:
        workload.append(f"prompt/output tokens: {values(summary, 'input_len')}/{values(summary, 'output_len')}")
    if "arrival_rate" in cols:
        rates = summary["arrival_rate"].cast(pl.Float64).drop_nulls().unique().sort(descending=True).to_list()
        workload.append(f"arrival rates (req/s): {', '.join(_rate_label(r) for r in rates)}")
    if "batch_size" in cols:
        workload.append(f"batch sizes: {', '.join(map(str, values(summary, 'batch_size')))}")
    if "replicas" in cols:
        workload.append(f"replicas: {', '.join(map(str, values(summary, 'replicas')))}")
    return [f"Workload: {'; '.join(workload)}"] if workload else []


def _runs_line(summary: pl.DataFrame, ok: pl.DataFrame) -> list[str]:
    """Runs measured, infeasible, not served, failed and not measured yet."""
    if "status" not in summary.columns:
        return []
    status = summary["status"]
    infeasible, missing, unsupported = (int((status == s).sum()) for s in ("infeasible", NOT_MEASURED, "unsupported"))
    failed = summary.height - ok.height - infeasible - missing - unsupported
    why = "batch does not fit the KV cache" if "batch_size" in summary.columns else "does not fit the GPU memory"
    runs = f"Runs: {ok.height} measured, {infeasible} infeasible ({why})"
    runs += f", {unsupported} not run: the engine does not serve the model" if unsupported else ""
    runs += f", {failed} failed" if failed else ""
    return [runs + (f", {missing} planned but not measured yet (no result file)" if missing else "")]


def _batch_notes(summary: pl.DataFrame, ok: pl.DataFrame) -> list[str]:
    """How the batch was held, and what fewer requests at small batches do to latency."""
    notes = []
    if "client" in values(summary, "batch_control"):
        notes.append(
            "Batch held by a client-side concurrency limit on one server per model (batch_control: client), "
            "not by restarting vLLM with --max-num-seqs = batch as the paper did."
        )
    if "scheduler" in values(summary, "batch_control"):
        notes.append(
            "Batch capped in vLLM's scheduler on one server per sweep (batch_control: scheduler; --max-num-seqs = "
            "the largest batch), all requests sent at once; the paper restarted vLLM with --max-num-seqs = batch."
        )
    if len(values(ok, "n_ok")) > 1:
        notes.append(
            "Small batches measured fewer requests (workload.rounds_per_batch or the model's own), as listed "
            "above. With every request sent at once, mean latency includes the wait for a batch slot (about half "
            "of requests/batch rounds), so at those points it is lower than with the paper's 500 requests; "
            "throughput is not affected."
        )
    return notes


def _folded_ids(summary: pl.DataFrame) -> list[str]:
    return [
        f"{name}: prompt token ids (GPT-2 BPE) folded into its {int(vocab):,}-token vocabulary (id mod "
        "vocabulary size); prompt lengths unchanged"
        for name, vocab in _per_model(summary, "prompt_ids_folded_into_vocab")
    ]


def _paper_difference() -> list[str]:
    return [f"Differs from {PAPER}: engine version, GPU, random weights."]


def _engine_args(summary: pl.DataFrame) -> list[str]:
    pairs = _per_model(summary, "engine_args")
    return [f"{name}: vLLM started with the extra arguments `{args}`" for name, args in pairs]


# --- repeats, confidence intervals, preemptions, energy windows -----------------------------------

CI_METHOD = "95% CI: Student's t over repeats (mean ± t(0.975, n-1)·sd/√n, slmserve.stats)"
# How captions name a plotted metric.
METRIC_NAMES = {
    "throughput_rps": "throughput", "latency_mean_s": "mean latency", "power_w_mean": "power",
    "energy_per_token_j": "energy per token", "gpu_util_mean": "GPU utilisation", "sm_active_mean": "SM activity",
    "sm_active_max": "max SM activity", "sm_occupancy_mean": "SM occupancy", "sm_occupancy_max": "max SM occupancy",
    "dram_bw_mean": "DRAM bandwidth", "dram_bw_max": "max DRAM bandwidth", "effective_batch": "effective batch",
}  # fmt: skip


def point_name(row: Mapping[str, Any]) -> str:
    """A plotted point in a caption: ``OPT-1.3B b=512``, ``OPT-125M ×3``, ``OPT-6.7B 2 GPUs b=64``,
    ``OPT-6.7B out 256, rate inf`` (``model`` is the display name once :func:`named` ran)."""
    parts = [str(row.get("model"))]
    if row.get("tp") not in (None, 1):
        parts.append(f"{row['tp']} GPUs")
    if row.get("plan") == "advisor":
        parts.append(f"advisor plan {plan_size(row)}{_mps(row)}")
    elif row.get("replicas") is not None:
        parts.append(f"×{row['replicas']}{_mps(row)}")
    elif row.get("point") is not None:
        parts.append(str(row["point"]))
    elif row.get("batch_size") is not None:
        parts.append(f"b={row['batch_size']}")
    return " ".join(parts)


def _ci_cols(runs: pl.DataFrame, metrics: Sequence[str]) -> list[pl.Expr]:
    """``<m>_ci_lo`` and ``<m>_ci_hi`` of each metric as Float64, null where absent or not finite."""
    out = []
    for m in metrics:
        for end in ("ci_lo", "ci_hi"):
            c = f"{m}_{end}"
            col = pl.col(c).cast(pl.Float64) if c in runs.columns else pl.lit(None, pl.Float64)
            out.append(pl.when(col.is_finite()).then(col).otherwise(None).alias(c))
    return out


def _points(k: int) -> str:
    """``1 point``, ``2 points``."""
    return f"{k} point{'s' * (k != 1)}"


def _repeats_note(runs: pl.DataFrame, name: Callable[[Mapping[str, Any]], str] = point_name) -> str:
    """``Repeats: n = 3 at 12 of 14 points; 2 points with n = 1: a, b`` of the plotted points."""
    if runs.is_empty():
        return "Repeats: no point plotted."
    if "n_repeats" not in runs.columns or runs["n_repeats"].is_null().all():
        return "Repeats per point: not recorded in this summary."
    counts = runs["n_repeats"].fill_null(0).cast(pl.Int64)
    common = counts.mode().sort()[-1]
    k = int((counts == common).sum())
    machines = _machines_note(runs, name) + _points_machines_note(runs, name)
    if k == runs.height:
        return f"Repeats: n = {common} per point ({_points(k)}).{machines}"
    line = f"Repeats: n = {common} at {k} of {runs.height} points"
    for n in sorted(set(counts.to_list()) - {common}):
        rows = runs.filter(counts == n)
        line += f"; {_points(rows.height)} with n = {n}: {', '.join(name(r) for r in rows.iter_rows(named=True))}"
    return line + "." + machines


def _machines_note(runs: pl.DataFrame, name: Callable[[Mapping[str, Any]], str] = point_name) -> str:
    """`` Repeats of 2 points ran on 2 machines (a job resumed on another): a, b.`` where any did."""
    if "n_machines" not in runs.columns:
        return ""
    rows = runs.filter(pl.col("n_machines").fill_null(1) > 1)
    if rows.is_empty():
        return ""
    most = int(rows["n_machines"].max())
    return (f" Repeats of {_points(rows.height)} ran on up to {most} machines (a job resumed "
            f"on another): {', '.join(name(r) for r in rows.iter_rows(named=True))}.")  # fmt: skip


def _points_machines_note(runs: pl.DataFrame, name: Callable[[Mapping[str, Any]], str] = point_name) -> str:
    """`` The points ran on 2 machines (...): a: p, q; b: r.`` where the plotted points came from more than one
    machine (``machines`` of the summary, slmserve.machine ids), and which points did not record theirs."""
    if "machines" not in runs.columns or runs.is_empty():
        return ""
    unknown = "not recorded"
    by: dict[str, list[str]] = {}
    for r in runs.iter_rows(named=True):
        by.setdefault(r["machines"] or unknown, []).append(name(r))
    recorded = [key for key in by if key != unknown]
    if not recorded:
        return " The points' machines are not recorded (written before results named it, 2026-11-26, or NVML failed)."
    if len(recorded) < 2:  # one machine, or one set for every point: said above
        missing = by.get(unknown, [])
        return f" Machine not recorded at {_points(len(missing))}: {', '.join(missing)}." if missing else ""
    order = sorted(by.items(), key=lambda kv: (kv[0] == unknown, kv[0]))  # the unrecorded last
    each = "; ".join(f"{key.replace(', ', ' + ')}: {', '.join(points)}" for key, points in order)
    ids = {m for key in recorded for m in key.split(", ")}
    return (f" The points ran on {len(ids)} machines (between two machines of one GPU model, a difference within "
            f"their spread, calibration table, can be theirs): {each}.")  # fmt: skip


def _ci_note(runs: pl.DataFrame, metrics: Sequence[str], name: Callable[[Mapping[str, Any]], str] = point_name) -> str:
    """Which plotted metrics carry a 95% CI, at how many points, and the method."""
    have = [m for m in metrics if m in CI_METRICS and f"{m}_ci_lo" in runs.columns]
    if not have:
        return f"No CI: {'; '.join(_without_ci(runs, metrics))}."
    with_ci = runs.filter(pl.any_horizontal(pl.col(f"{m}_ci_lo").is_not_null() for m in have)).height
    without = _without_ci(runs, [m for m in metrics if m not in have])
    rest = f"; {'; '.join(without)}" if without else ""
    if not with_ci:
        return f"{CI_METHOD}: none drawn, no plotted point has n >= 2{rest}."
    unmeasured = [m for m in have if runs[f"{m}_ci_lo"].is_null().all()]  # e.g. GPU metrics on the CPU engine
    if unmeasured:
        rest += f"; {', '.join(METRIC_NAMES.get(m, m) for m in unmeasured)}: no CI at any point (fewer than 2 values)"
    drawn = ", ".join(METRIC_NAMES.get(m, m) for m in have if m not in unmeasured)
    where = f"{'the ' * (with_ci > 1)}{_points(with_ci)}"
    fewer = _fewer_values_note(runs, have, name)
    return f"{CI_METHOD}, drawn as error bars on {drawn} at {where} with n >= 2{rest}.{fewer}"


def _without_ci(runs: pl.DataFrame, metrics: Sequence[str]) -> list[str]:
    """Why each of ``metrics`` carries no CI column: not a metric with a CI, or a summary made before it was one."""
    outside = [METRIC_NAMES.get(m, m) for m in metrics if m not in CI_METRICS]
    older = [METRIC_NAMES.get(m, m) for m in metrics if m in CI_METRICS and f"{m}_ci_lo" not in runs.columns]
    return [
        *([f"{', '.join(outside)}: means over repeats, not among the metrics with a CI (analysis.CI_METRICS)"]
          if outside else []),
        *([f"{', '.join(older)}: means over repeats without a CI in this summary (summarized before "
           f"analysis.CI_METRICS held {'it' if len(older) == 1 else 'them'}; re-summarize)"] if older else []),
    ]  # fmt: skip


def _fewer_values_note(
    runs: pl.DataFrame, metrics: Sequence[str], name: Callable[[Mapping[str, Any]], str] = point_name
) -> str:
    """`` Fewer values than repeats (a repeat without that metric): power at a (n = 2 of 3).`` where any
    repeat has a value (a metric no repeat has is not drawn at all)."""
    if "n_repeats" not in runs.columns:
        return ""
    said = []
    for m in (m for m in metrics if f"{m}_n" in runs.columns):
        short = runs.filter((pl.col(f"{m}_n") > 0) & (pl.col(f"{m}_n") < pl.col("n_repeats")))
        said += [f"{METRIC_NAMES.get(m, m)} at {name(r)} (n = {r[f'{m}_n']} of {r['n_repeats']})"
                 for r in short.iter_rows(named=True)]  # fmt: skip
    return f" Fewer values than repeats (a repeat without that metric): {'; '.join(said)}." if said else ""


def _preemption_note(runs: pl.DataFrame, name: Callable[[Mapping[str, Any]], str] = point_name) -> str:
    """The plotted points where vLLM preempted requests, with the count (mean over repeats), and those whose
    count is unknown (null: a repeat has none, :func:`slmserve.analysis.points`), which are not "none"."""
    if "preemptions" not in runs.columns or runs["preemptions"].is_null().all():
        return "Preemptions: not recorded in this summary."
    hit = runs.filter(pl.col("preemptions") > 0)
    unknown = runs.filter(pl.col("preemptions").is_null())
    said = ""
    if not unknown.is_empty():
        which = ", ".join(name(r) for r in unknown.iter_rows(named=True))
        said = (f" Preemption count unknown (a repeat has none: its /metrics read failed) at {unknown.height} of "
                f"{runs.height} plotted points: {which}.")  # fmt: skip
    if hit.is_empty():
        known = runs.height - unknown.height
        where = "any plotted point" if unknown.is_empty() else f"the {_points(known)} with a count"
        return f"Preemptions (vLLM's counter, mean over repeats): none at {where}.{said}"
    # a mean over repeats (e.g. 209/3): one decimal tells apart what a count can differ by
    each = "; ".join(f"{name(r)}: {round(r['preemptions'], 1):g}" for r in hit.iter_rows(named=True))
    return (f"Preemptions (vLLM's counter, mean over repeats) at {hit.height} of {runs.height} plotted points: "
            f"{each}.{_warmup_counted(hit.iter_rows(named=True))}{said}")  # fmt: skip


def _warmup_counted(rows: Iterable[Mapping[str, Any]]) -> str:
    """A caption's warning on the positive preemption counts among ``rows`` that include the warm-up's
    requests (:func:`slmserve.analysis.measured_only`; a row without the flag counts as such)."""
    n = sum(1 for r in rows if (r.get("preemptions") or 0) > 0 and r.get("preemptions_measured_only") is not True)
    if not n:
        return ""
    return (f" Counted with the warm-up's requests at {n} of them (results written before 2026-11-29 read vLLM's "
            "counter before the warm-up): at most, not exactly, the measured requests' count.")  # fmt: skip


def point_notes(
    runs: pl.DataFrame, metrics: Sequence[str], name: Callable[[Mapping[str, Any]], str] = point_name
) -> list[str]:
    """The caption's lines on the plotted points: repeats, CIs of ``metrics``, preemptions."""
    return [_repeats_note(runs, name), _ci_note(runs, metrics, name), _preemption_note(runs, name)]


def _energy_note(runs: pl.DataFrame, name: Callable[[Mapping[str, Any]], str] = point_name) -> list[str]:
    """The energy windows of the plotted points (range of the mean window over repeats, and of samples) and
    the points the summary does not trust (``energy_window_ok`` false: a repeat's window shorter than
    ENERGY_MIN_WINDOW_S) or does not say (null), as :func:`_window_ok` draws them."""
    if "energy_window_s" not in runs.columns or runs["energy_window_s"].is_null().all():
        return ["Energy window: not recorded in this summary."]
    w = runs["energy_window_s"].drop_nulls()
    n = runs["energy_samples"].drop_nulls() if "energy_samples" in runs.columns else pl.Series([], dtype=pl.Int64)
    line = f"Energy window per point (mean over repeats): {w.min():.1f}-{w.max():.1f} s" + (
        f", {n.min()}-{n.max()} telemetry samples (a point's fewest over repeats)" if n.len() else ""
    )
    flag = runs["energy_window_ok"] if "energy_window_ok" in runs.columns else pl.Series([None] * runs.height)
    short, unknown = runs.filter(flag.cast(pl.Boolean).not_()), runs.filter(flag.is_null())
    limit = f"{ENERGY_MIN_WINDOW_S:g} s (analysis.ENERGY_MIN_WINDOW_S)"
    if short.is_empty() and unknown.is_empty():
        return [f"{line}; every repeat's window is at least {limit}."]
    notes = [f"{line}."]
    if not short.is_empty():
        which = ", ".join(f"{name(r)} ({r['energy_window_s']:.1f} s)" for r in short.iter_rows(named=True))
        notes.append(f"{short.height} of {runs.height} points have a repeat whose window is shorter than {limit}, "
                     f"too short for a trusted energy figure; drawn hollow/faded (mean window): {which}.")  # fmt: skip
    if not unknown.is_empty():
        which = ", ".join(name(r) for r in unknown.iter_rows(named=True))
        notes.append(f"{unknown.height} of {runs.height} points do not record whether every repeat's window reached "
                     f"{limit} (no energy_window_ok in the summary); drawn hollow/faded: {which}.")  # fmt: skip
    return notes


# --- shared chart shapes --------------------------------------------------------------------------


def color_scale(order: Sequence[str], field: str = "model", title: str = "Model", legend: bool = True) -> alt.Color:
    kwargs = {"sort": list(order), "scale": alt.Scale(domain=list(order))} if order else {}
    return alt.Color(f"{field}:N", title=title, **kwargs, **({} if legend else {"legend": None}))


def no_data() -> alt.Chart:
    """A gray "no data" note in the middle of an empty plot (its own one-row sequence, not a dataset)."""
    note = alt.Chart(alt.sequence(0, 1)).mark_text(fontSize=13, color="gray")
    return note.encode(x=alt.value(210), y=alt.value(150), text=alt.value("no data (see caption)"))


def _tradeoff(
    data: pl.DataFrame,
    *,
    title: str,
    label: str,
    order: Sequence[str] = (),
    color: str = "model",
    color_title: str = "Model",
    shape: str | None = None,
    shape_title: str | None = None,
    log_x: bool = True,
) -> alt.LayerChart:
    """Throughput (requests/s) against mean latency: one line per ``series``, points labelled by ``label``
    and connected in its order. Layers: lines, points, labels."""
    x_scale = alt.Scale(type="log") if log_x else alt.Scale(zero=False)
    base = alt.Chart(data).encode(
        x=alt.X("latency_mean_s:Q", title=X_LATENCY, scale=x_scale),
        y=alt.Y("throughput_rps:Q", title=Y_THROUGHPUT),
        color=color_scale(order, color, color_title),
    )
    lines = base.mark_line().encode(detail="series:N", order=f"{label}:Q")
    points = base.mark_point(filled=True, size=50).encode(
        tooltip=[c for c in data.columns if c != "series"],
    )
    if shape:
        lines = lines.encode(strokeDash=alt.StrokeDash(f"{shape}:N", legend=None))
        points = points.encode(shape=alt.Shape(f"{shape}:N", title=shape_title))
    labels = base.mark_text(dy=-9, fontSize=9).encode(text=f"{label}:Q")
    layers = [lines, points, labels, *_tradeoff_ci(base, data, x_scale, log_x)]
    return alt.layer(*layers, *([no_data()] if data.is_empty() else [])).properties(title=title)


X_LATENCY, Y_THROUGHPUT = "Mean end-to-end latency (s)", "Throughput (requests/s)"


def _tradeoff_ci(base: alt.Chart, data: pl.DataFrame, x_scale: alt.Scale, log_x: bool) -> list[alt.Chart]:
    """Error bars of the 95% CIs: vertical on throughput, horizontal on latency, where the data has them. On a
    log axis a latency interval reaching zero or below is left out (it would break the axis for every
    point); :func:`log_ci_notes` names those points in the caption."""
    bars = []
    if "throughput_rps_ci_lo" in data.columns:
        y = alt.Y("throughput_rps_ci_lo:Q", title=Y_THROUGHPUT)
        rule = base.mark_rule(strokeWidth=1.5).encode(y=y, y2="throughput_rps_ci_hi:Q")
        bars.append(rule.transform_filter("isValid(datum.throughput_rps_ci_lo)"))
    if "latency_mean_s_ci_lo" in data.columns:
        x = alt.X("latency_mean_s_ci_lo:Q", title=X_LATENCY, scale=x_scale)
        rule = base.mark_rule(strokeWidth=1.5).encode(x=x, x2="latency_mean_s_ci_hi:Q")
        positive = " && datum.latency_mean_s_ci_lo > 0" if log_x else ""
        bars.append(rule.transform_filter(f"isValid(datum.latency_mean_s_ci_lo){positive}"))
    return bars


def log_ci_notes(runs: pl.DataFrame, metric: str = "latency_mean_s") -> list[str]:
    """The caption's line on the points whose ``metric`` CI reaches zero or below: not drawn on a log axis."""
    col = f"{metric}_ci_lo"
    low = runs.filter(pl.col(col) <= 0) if col in runs.columns else runs.clear()
    if low.is_empty():
        return []
    which = ", ".join(
        f"{point_name(r)} (n = {r.get(f'{metric}_n') or r.get('n_repeats')})" for r in low.iter_rows(named=True)
    )
    return [f"The 95% CI of {METRIC_NAMES.get(metric, metric)} reaches zero or below at {which}: the log axis "
            "cannot draw it, so no bar there (the interval is in the summary)."]  # fmt: skip


# A panel of a batch-size figure: (panel title, y-axis title, {statistic: summary column}).
Panel = tuple[str, str, dict[str, str]]
_LONG_SCHEMA = {"model": pl.String, "batch_size": pl.Int64, "panel": pl.String, "stat": pl.String, "value": pl.Float64,
                "lo": pl.Float64, "hi": pl.Float64, "ok": pl.Boolean}  # fmt: skip


def _window_ok(runs: pl.DataFrame) -> pl.Expr:
    """The summary's ``energy_window_ok`` (:func:`slmserve.analysis.energy_metrics`, true only where every repeat's
    window reached ENERGY_MIN_WINDOW_S); null where the summary does not record it. Only true is drawn as
    trusted."""
    if "energy_window_ok" not in runs.columns:
        return pl.lit(None, pl.Boolean)
    return pl.col("energy_window_ok").cast(pl.Boolean)


def _batch_long(runs: pl.DataFrame, panels: Sequence[Panel]) -> pl.DataFrame:
    """One row per (run, panel, statistic): model, batch_size, panel, stat, value (nulls dropped), the 95% CI
    (lo, hi; null where the point has none) and ok (:func:`_window_ok` for energy, else true; hollow unless true)."""
    frames = [
        runs.with_columns(_ci_cols(runs, [col])).select(
            pl.col("model").cast(pl.String),
            pl.col("batch_size").cast(pl.Int64),
            panel=pl.lit(title),
            stat=pl.lit(stat),
            value=pl.col(col).cast(pl.Float64),
            lo=pl.col(f"{col}_ci_lo"),
            hi=pl.col(f"{col}_ci_hi"),
            ok=_window_ok(runs) if col == "energy_per_token_j" else pl.lit(True),
        )
        for title, _, cols in panels
        for stat, col in cols.items()
        if col in runs.columns
    ]
    data = pl.concat(frames) if frames else pl.DataFrame(schema=_LONG_SCHEMA)
    return _finite(data, ["batch_size", "value"]).sort(["panel", "stat", "model", "batch_size"])


def _batch_lines(
    data: pl.DataFrame, panels: Sequence[Panel], *, title: str, order: Sequence[str], y_log: bool = False
) -> alt.TopLevelMixin:
    """Lines against batch size (log2 axis), a color per model, mean/max as line styles; one panel per
    entry of ``panels`` side by side, all drawn from the one long dataset of :func:`_batch_long`."""
    ticks = sorted(set(data["batch_size"].to_list()))
    x = alt.X(
        "batch_size:Q",
        title="Batch size",
        scale=alt.Scale(type="log", base=2),
        axis=alt.Axis(values=ticks, format="d") if ticks else alt.Axis(format="d"),
    )
    charts = []
    for ptitle, ytitle, cols in panels:
        stats = list(cols)
        base = (
            alt.Chart()
            .transform_filter(alt.FieldEqualPredicate(field="panel", equal=ptitle))
            .encode(
                x=x,
                y=alt.Y("value:Q", title=ytitle, scale=alt.Scale(type="log") if y_log else alt.Scale()),
                color=color_scale(order),
            )
        )
        lines = base.mark_line().encode(detail="stat:N", order="batch_size:Q")
        points = base.mark_point(filled=True, size=35).encode(tooltip=["model", "batch_size", "stat", "value"])
        if len(stats) > 1:
            dash = alt.Scale(domain=stats, range=[[1, 0], [6, 3], [2, 2]][: len(stats)])
            lines = lines.encode(strokeDash=alt.StrokeDash("stat:N", title="Statistic", sort=stats, scale=dash))
            points = points.encode(shape=alt.Shape("stat:N", sort=stats, legend=None))
        errors = base.mark_rule(strokeWidth=1.5).encode(y=alt.Y("lo:Q", title=ytitle), y2="hi:Q")
        hollow = base.mark_point(filled=True, size=12).encode(color=alt.value("white"))
        drawable = "isValid(datum.lo)" + (" && datum.lo > 0" if y_log else "")  # log_ci_notes names the others
        layers = [lines, points, errors.transform_filter(drawable),
                  hollow.transform_filter("datum.ok !== true")]  # fmt: skip
        if data.filter(pl.col("panel") == ptitle).is_empty():  # say so on the chart (the caption says why)
            layers.append(no_data())
        charts.append(alt.layer(*layers, title=ptitle if len(panels) > 1 else title))
    if len(charts) == 1:
        return alt.layer(*charts[0].layer, data=data, title=title)
    return alt.hconcat(*charts, data=data, title=title)


def _bars(
    data: pl.DataFrame,
    *,
    y: str,
    y_title: str,
    title: str,
    order: Sequence[str],
    group: str | None = None,
    group_title: str | None = None,
    group_order: Sequence[str] = (),
    text: str | None = None,
    text_format: str = ".0f",
) -> alt.LayerChart:
    """Bars per model (in ``order``); grouped side by side by ``group`` (a color each) when given; each bar
    labelled with ``text`` (a string column) or else its value; error bars where the data has the 95% CI of
    ``y`` (``<y>_ci_lo``, ``<y>_ci_hi``); bars faded where ``energy_window_ok`` is not true (false or unknown)."""
    base = alt.Chart(data).encode(
        x=alt.X("model:N", title="Model", sort=list(order), axis=alt.Axis(labelAngle=0)),
        y=alt.Y(f"{y}:Q", title=y_title),
    )
    if group:
        sort = {"sort": list(group_order)} if group_order else {}
        base = base.encode(xOffset=alt.XOffset(f"{group}:N", **sort))
        color = alt.Color(f"{group}:N", title=group_title or group, **sort)
    else:
        color = color_scale(order, legend=False)
    bars = base.mark_bar().encode(color=color, tooltip=list(data.columns))
    if "energy_window_ok" in data.columns:  # a window too short to trust, or not known to be long enough: faded
        bars = bars.encode(opacity=alt.condition("datum.energy_window_ok !== true", alt.value(0.35), alt.value(1.0)))
    label = alt.Text(f"{text}:N") if text else alt.Text(f"{y}:Q", format=text_format)
    labels = base.mark_text(baseline="bottom", dy=-3, fontSize=10).encode(text=label)
    layers = [bars, labels]
    if f"{y}_ci_lo" in data.columns:
        errors = base.mark_rule(strokeWidth=1.5, color="black").encode(y=alt.Y(f"{y}_ci_lo:Q", title=y_title),
                                                                      y2=f"{y}_ci_hi:Q")  # fmt: skip
        layers.append(errors.transform_filter(f"isValid(datum.{y}_ci_lo)"))
    if data.is_empty():
        layers.append(no_data())
    return alt.layer(*layers).properties(title=title, width=420)


# --- Figures 1 and 2: throughput/latency trade-offs ------------------------------------------------

TRADEOFF = ("throughput_rps", "latency_mean_s")  # the trade-off figures' metrics (both with a CI)


def throughput_latency(summary: pl.DataFrame) -> tuple[alt.LayerChart, str]:
    """Figure 1: throughput (requests/s) against mean latency, one point per batch size, a curve per
    model and GPU count."""
    runs, notes = main_workload(ok_runs(summary))
    runs, order = named(runs)
    runs = _finite(runs, TRADEOFF)
    gpus, kind, extra = pl.col("tp").cast(pl.String), pl.lit(""), []
    if mixed_gpus(runs):  # a curve and a marker per GPU model, never one line through two kinds of GPU
        kind, extra = pl.lit(" · ") + pl.col("gpu_model"), ["gpu_model"]
    data = runs.select(
        "model", "tp", "batch_size", "throughput_rps", "latency_mean_s", *extra, *_ci_cols(runs, TRADEOFF),
        series=pl.col("model") + pl.lit(" · ") + gpus + pl.lit(" GPU") + kind,
        gpus=gpus + kind,
    )  # fmt: skip
    chart = _tradeoff(
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
    runs, notes = main_workload(_one_gpu(ok_runs(summary)))
    runs = _finite(runs, TRADEOFF)
    claim = _drain_note(runs) + _family_ratios(runs)  # Figure 2's claim, before named() relabels the models
    runs, order = named(runs)
    data = runs.select(
        "model", "batch_size", "throughput_rps", "latency_mean_s", *_ci_cols(runs, TRADEOFF), series=pl.col("model")
    )
    chart = _tradeoff(data, title="Families of similar size (Figure 2, left)", label="batch_size", order=order)
    notes += [*point_notes(runs, TRADEOFF), *log_ci_notes(runs), *claim]
    if "family" in summary.columns:
        missing = [f for f in PAPER_FAMILIES if f not in set(summary["family"].drop_nulls().to_list())]
        notes += [f"{f}: no run in this summary (in the paper's Figure 2, left)" for f in missing]
    notes.append("One GPU (tp = 1), all requests at once; the paper's curves are on one A100 40 GB.")
    return chart, caption(
        _one_gpu(summary), "Figure 2 (left): throughput vs mean latency per model family, labels = batch size", notes
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
    at_once = runs.filter(_at_once() & (pl.col("n_ok") > 0))
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
    # _finite types an all-null column (no family known) as Float64
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
    frame = _one_gpu(summary.filter(pl.col("model") == model)) if model else summary.head(0)
    runs = _largest_batch(ok_runs(frame), ["arrival_rate", "output_len"]) if not frame.is_empty() else frame
    runs, _ = named(runs)
    runs = _finite(runs, TRADEOFF).sort(["arrival_rate", "output_len"], descending=[True, False])
    rates = runs["arrival_rate"].cast(pl.Float64).unique().sort(descending=True).to_list() if runs.height else []
    order = [_rate_label(r) for r in rates]
    data = runs.select(
        "model", "output_len", "batch_size", "throughput_rps", "latency_mean_s",
        *_ci_cols(runs, [*TRADEOFF, "effective_batch"]),
        effective_batch=_float_or_null(runs, "effective_batch"), preemptions=_float_or_null(runs, "preemptions"),
        rate=pl.col("arrival_rate").cast(pl.Float64).map_elements(_rate_label, return_dtype=pl.String),
    ).with_columns(series=pl.col("rate"))  # fmt: skip
    left = _tradeoff(
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
    return f"{row['output_len']} tokens at {_rate_label(row.get('arrival_rate'))} req/s"


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


# --- Figures 3, 8 and extras: metrics against batch size -------------------------------------------


def _batch_figure(
    summary: pl.DataFrame, panels: Sequence[Panel], *, title: str, what: str, notes: list[str], y_log: bool = False
) -> tuple[alt.TopLevelMixin, str]:
    """A figure of metrics against batch size on one GPU (tp == 1), all-at-once workload."""
    frame = _one_gpu(summary)
    runs, left_out = main_workload(ok_runs(frame))
    runs, order = named(runs)
    data = _batch_long(runs, panels)
    chart = _batch_lines(data, panels, title=title, order=order, y_log=y_log)
    metrics = [c for _, _, cols in panels for c in cols.values()]
    telemetry = [c for c in metrics if c not in ("throughput_rps", "latency_mean_s")]
    plotted = _finite(runs, ["batch_size"]).filter(pl.any_horizontal(pl.col(c).is_not_null() for c in metrics)) \
        if set(metrics) <= set(runs.columns) else runs.head(0)  # fmt: skip
    notes = [*notes, *point_notes(plotted, metrics)]
    if y_log:  # an interval reaching 0 is not drawn on the log axis: say where
        notes += [n for m in metrics for n in log_ci_notes(plotted, m)]
    if "energy_per_token_j" in metrics:
        notes += _energy_note(plotted)
    return chart, caption(frame, what, left_out + notes, telemetry=telemetry)


def sm_metrics(summary: pl.DataFrame) -> tuple[alt.TopLevelMixin, str]:
    """Figure 3: SM activity and SM occupancy (%), mean and max over the run, against batch size (log2),
    a color per model, one GPU."""
    panels = [
        ("SM activity", "SM activity (%)", {"mean": "sm_active_mean", "max": "sm_active_max"}),
        ("SM occupancy", "SM occupancy (%)", {"mean": "sm_occupancy_mean", "max": "sm_occupancy_max"}),
    ]
    notes = [
        "Per repeat, the mean and the maximum over the 100 ms samples of its measurement window (the paper: over all "
        "time steps); a point is the mean over repeats of each (for max: the repeats' maxima averaged, not the "
        "largest of them)."
    ]
    return _batch_figure(
        summary, panels, title="SM activity and occupancy on one GPU (Figure 3)",
        what="Figure 3: SM activity and SM occupancy (mean, max) vs batch size, one GPU", notes=notes,
    )  # fmt: skip


def util_throughput(summary: pl.DataFrame) -> tuple[alt.TopLevelMixin, str]:
    """Figure 8: average GPU utilisation (%) and throughput (requests/s) against batch size per model, one GPU."""
    panels = [
        ("GPU utilisation", "Average GPU utilisation (%)", {"mean": "gpu_util_mean"}),
        ("Throughput", "Throughput (requests/s)", {"mean": "throughput_rps"}),
    ]
    notes = ["GPU utilisation: NVML utilization.gpu (what DCGM_FI_DEV_GPU_UTIL reports), share of time a kernel ran."]
    return _batch_figure(
        summary, panels, title="GPU utilisation and throughput (Figure 8)",
        what="Figure 8: average GPU utilisation and throughput vs batch size, one GPU", notes=notes,
    )  # fmt: skip


def dram_bandwidth(summary: pl.DataFrame) -> tuple[alt.TopLevelMixin, str]:
    """Beyond the paper: DRAM bandwidth utilisation (%), mean and max, against batch size per model."""
    panels = [("DRAM bandwidth", "DRAM bandwidth utilisation (%)", {"mean": "dram_bw_mean", "max": "dram_bw_max"})]
    notes = [
        "Not in the paper. Its follow-up, Recasens et al., 'Mind the Memory Gap: Unveiling GPU Bottlenecks in "
        "Large-Batch LLM Inference' (2025), argues that large-batch inference stays memory-bound: DRAM bandwidth "
        "saturates while compute is underused, rather than the shift to a compute-bound regime that the paper "
        "gives for the throughput plateau (its Section 2.3). High DRAM utilisation at the batches where "
        "throughput stops growing supports that reading.",
        "DRAM bandwidth: NVML GPM DRAM_BW_UTIL (share of peak HBM bandwidth), per repeat the mean and max over the "
        "100 ms samples; a point is the mean over repeats of each (for max: the repeats' maxima averaged).",
    ]
    return _batch_figure(
        summary, panels, title="DRAM bandwidth utilisation on one GPU (beyond the paper)",
        what="DRAM bandwidth utilisation (mean, max) vs batch size, one GPU", notes=notes,
    )  # fmt: skip


def energy_per_token(summary: pl.DataFrame) -> tuple[alt.TopLevelMixin, str]:
    """Beyond the paper: GPU energy per output token (J) against batch size per model, one GPU."""
    panels = [("Energy per token", "GPU energy per output token (J)", {"mean": "energy_per_token_j"})]
    notes = [
        "Not in the paper (its Figure 4 shows power only). Energy: NVML's cumulative energy counter over the "
        "measurement window, summed over the job's GPUs, divided by the output tokens; log y axis."
    ]
    return _batch_figure(
        summary, panels, title="Energy per output token on one GPU (beyond the paper)",
        what="Energy per output token vs batch size, one GPU", notes=notes, y_log=True,
    )  # fmt: skip


# --- Figure 4: power at the largest batch ---------------------------------------------------------


def power(summary: pl.DataFrame) -> tuple[alt.LayerChart, str]:
    """Figure 4: average power (W) per model at its largest measured feasible batch on one GPU (runs
    without preemptions preferred), each bar labelled with that batch size."""
    frame = _one_gpu(summary)
    runs, left_out = main_workload(ok_runs(frame))
    candidates = _finite(runs, ["power_w_mean"])
    runs = _largest_batch(candidates, ["model"]) if runs.height else runs
    runs, order = named(runs)
    data = _finite(runs, ["power_w_mean"]).select(
        "model", "batch_size", "power_w_mean", *_ci_cols(runs, ["power_w_mean"]),
        label=pl.lit("bs ") + pl.col("batch_size").cast(pl.String),
    )  # fmt: skip
    chart = _bars(
        data, y="power_w_mean", y_title="Average power (W)", order=order, text="label",
        title="Average GPU power at the largest batch (Figure 4)",
    )  # fmt: skip
    notes = [
        *left_out, *_power_rule(candidates, runs),
        "Power: mean of NVML power readings over the window (on Hopper the driver's ~1 s moving average).",
        *point_notes(_finite(runs, ["power_w_mean"]), ["power_w_mean"]),
    ]  # fmt: skip
    return chart, caption(
        frame, "Figure 4: average GPU power (W) at the largest batch per model", notes, ["power_w_mean"]
    )


def _power_rule(candidates: pl.DataFrame, chosen: pl.DataFrame) -> list[str]:
    """Figure 4's rule for "largest batch", the batch it chose per model and the larger runs it skipped."""
    fits = f" (the sweep's configured fit rule, engine.fits: {', '.join(values(candidates, 'fits'))})" \
        if values(candidates, "fits") else ""  # fmt: skip
    rule = (
        f"Batch rule: among the runs measured on one GPU{fits}, the largest batch without preemptions (the "
        "no-preemption rule applied to the measured runs; a run whose count is unknown does not count as without); "
        "a model with no run known to be without preemptions gets its largest batch. The paper used the Table 1 "
        "maximum of a 40 GB A100."
    )
    if chosen.is_empty():
        return [rule, "Chosen: none."]
    names = model_names(candidates)
    size = {name: params for name, params in names.values()}
    chosen = chosen.sort(pl.col("model").replace_strict(size, default=math.inf, return_dtype=pl.Float64))
    chosen_at = {r["model"]: r for r in chosen.iter_rows(named=True)}
    picked = ", ".join(f"{m}: batch {r['batch_size']}" + ("" if r["preemptions"] == 0 else f" ({_preemptions(r)})")
                       for m, r in chosen_at.items())  # fmt: skip
    larger = [
        r for r in candidates.sort("model", "batch_size").iter_rows(named=True)
        if names[r["model"]][0] in chosen_at and r["batch_size"] > chosen_at[names[r["model"]][0]]["batch_size"]
    ]  # fmt: skip
    skipped = ", ".join(f"{names[r['model']][0]} b={r['batch_size']} ({_preemptions(r)})" for r in larger)
    unknown = any(r["preemptions"] is None for r in larger)
    what = "with preemptions or an unknown count" if unknown else "with preemptions"
    counted = _warmup_counted([*chosen_at.values(), *larger])
    return [rule, f"Chosen: {picked}.", f"Skipped (larger batches {what}): {skipped or 'none'}.{counted}"]


def _preemptions(row: Mapping[str, Any]) -> str:
    """``12 preemptions`` (the mean over repeats), or that the count is unknown."""
    return "preemption count unknown" if row.get("preemptions") is None else f"{row['preemptions']:g} preemptions"


# --- Figures 5-7 and extra: replication ------------------------------------------------------------


def plan_size(row: Mapping[str, Any]) -> str:
    """``4×256``: a replication run's replicas × batch per replica (``?`` where the summary has none)."""
    n, b = row.get("replicas"), row.get("batch_per_replica")
    return f"{'?' if n is None else n}×{'?' if b is None else b}"


def _mps(row: Mapping[str, Any]) -> str:
    """`` MPS`` where a replication run's replicas ran under NVIDIA MPS."""
    return " MPS" if row.get("mps") else ""


def setup_label(row: Mapping[str, Any]) -> str:
    """A replication run's bar and legend label: the replica count for the paper's equal split (``×2``), the
    plan for the batching advisor's (``advisor 4×256``); `` MPS`` where the replicas ran under MPS."""
    base = f"advisor {plan_size(row)}" if row.get("plan") == "advisor" else f"×{row.get('replicas')}"
    return base + _mps(row)


def _one_instance(row: Mapping[str, Any]) -> bool:
    """The reference of the gains: one replica at the one-GPU maximum batch (the equal split's ×1), no MPS."""
    return row.get("plan", "equal") == "equal" and row.get("replicas") == 1 and not row.get("mps")


def _with_setup(runs: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """``runs`` with ``setup`` (:func:`setup_label`) and ``how`` (equal split or advisor plan, MPS or not),
    and the setups in legend order: the equal split by replicas, then the advisor's plans."""
    rows = list(runs.iter_rows(named=True))
    setups = [setup_label(r) for r in rows]
    hows = [("advisor plan" if r.get("plan") == "advisor" else "equal split") + (", MPS" if r.get("mps") else "")
            for r in rows]  # fmt: skip
    keys = {s: (r.get("plan") == "advisor", r.get("mps") or False, r.get("replicas") or 0)
            for s, r in zip(setups, rows, strict=True)}  # fmt: skip
    order = sorted(keys, key=lambda s: keys[s])
    return runs.with_columns(setup=pl.Series(setups, dtype=pl.String), how=pl.Series(hows, dtype=pl.String)), order


def _plan_gains(runs: pl.DataFrame) -> list[str]:
    """Per model, each run's system throughput over one instance's (the equal split's one replica, no MPS):
    the ratio of means with its 95% CI (:func:`slmserve.stats.ratio_ci_of`, from the summary's n, mean and
    sd), and the run of the largest mean (older summaries without ``plan`` hold the equal split only)."""
    per = []
    size = {name: params for name, params in model_names(runs).values()}
    runs = runs.sort(pl.col("model").replace_strict(size, default=math.inf, return_dtype=pl.Float64),
                     maintain_order=True)  # fmt: skip
    for (model,), group in runs.group_by("model", maintain_order=True):
        rows = list(group.iter_rows(named=True))
        one = next((r for r in rows if _one_instance(r)), None)
        if one is None:
            per.append(f"{model}: no one-instance run to compare with")
            continue
        gains = []
        for r in rows:
            if not _one_instance(r):
                g = stats.ratio_ci_of(stats.summary_sample(r), stats.summary_sample(one))
                if g["ratio"] is not None:
                    gains.append((g, setup_label(r)))
        if not gains:
            continue
        text = ", ".join(f"{s} {g['ratio']:.3f}" + (f" [{g['ci_lo']:.3f}, {g['ci_hi']:.3f}]" if g["ci_lo"] is not None
                                                     else " (no CI)") for g, s in gains)  # fmt: skip
        best, name = max(gains, key=lambda t: t[0]["ratio"])
        lo = best["ci_lo"]
        if best["ratio"] <= 1:
            below = all(g["ci_hi"] is not None and g["ci_hi"] < 1 for g, _ in gains)
            verdict = "largest mean: one instance" + (" (every other run's CI below 1)" if below else "")
        else:
            said = "no CI" if lo is None else "a gain: its CI excludes 1" if lo > 1 else "its CI contains 1"
            verdict = f"largest mean: {name} ({said})"
        per.append(f"{model}: {text}; {verdict}")
    if not per:
        return []
    return ["Gain over one instance (system throughput / that of one replica at the one-GPU maximum batch, no MPS; "
            f"ratio of means, 95% CI by the delta method): {'; '.join(per)}."]  # fmt: skip


def _replica_setup_notes(summary: pl.DataFrame) -> list[str]:
    """How the measured replicas ran (columns ``start`` and ``mps`` of the summary, where it has them)."""
    if not {"start", "mps"} <= set(summary.columns):
        return []
    setups = ok_runs(summary).select("start", "mps").unique().sort("start", "mps").iter_rows(named=True)
    said = [
        ("started together, each with explicit KV-cache bytes from the probe" if r["start"] == "together"
         else "started one after another") + ("; under NVIDIA MPS" if r["mps"]
                                               else "; separate processes, time-sliced on the GPU (no MPS)")
        for r in setups
    ]  # fmt: skip
    return [f"Replica servers: {' | '.join(said)}."] if said else []


def _memory_note(summary: pl.DataFrame) -> str:
    """What memory the replicas split: the GPU's configured share, or an emulated smaller GPU's budget."""
    runs = ok_runs(summary)
    budgets = sorted(set(runs["memory_budget_gb"].drop_nulls())) if "memory_budget_gb" in runs.columns else []
    if not budgets:
        return "an equal share of the configured memory share"
    gb = " / ".join(f"{b:g} GB" for b in budgets)
    return f"an equal share of {gb} (engine.memory_budget_gb: a smaller GPU emulated, as the paper's 40 GB A100)"


def _replication_notes(summary: pl.DataFrame) -> list[str]:
    notes = [
        f"Replicas of one model share one GPU, each with {_memory_note(summary)}; the "
        "requests are split evenly and sent at once; latency = the largest replica mean (as in the paper).",
        "Throughput plotted: the system throughput = all replicas' completed requests / (last end - first send "
        "on the replicas' common clock). The paper summed each replica's own rate (throughput_sum_rps), which "
        "exceeds the system throughput when replicas finish at different times.",
    ]
    if "batch_per_replica" in summary.columns:
        names = model_names(summary)
        per = ok_runs(summary).sort(
            pl.col("model").map_elements(lambda m: names[m][1], return_dtype=pl.Float64), pl.col("replicas")
        )
        advised = per.filter(pl.col("plan") == "advisor") if "plan" in per.columns else per.head(0)
        per = per.filter(pl.col("plan") != "advisor") if "plan" in per.columns else per
        batches = ", ".join(
            f"{names[r['model']][0]} ×{r['replicas']}: {r['batch_per_replica']}" for r in per.iter_rows(named=True)
        )
        notes.append(f"Batch per replica = the largest one-GPU batch / replicas ({batches or 'none'}).")
        if "plan" in summary.columns and (summary["plan"] == "advisor").any():
            plans = ", ".join(f"{names[r['model']][0]}: {plan_size(r)}{_mps(r)}" for r in advised.iter_rows(named=True))
            notes.append(
                "Beyond the paper, the batching advisor's plan (slmserve.replication.advisor_plan; the advisor run on "
                "the model's one-GPU sweep, as in advisor.csv): max(1, min(replicas_fit, max_replicas)) replicas of "
                "its chosen batch, the memory split evenly, labelled 'advisor replicas×batch' "
                f"({plans or 'none measured'})."
            )
    notes += _replica_setup_notes(summary)
    if "status" in summary.columns:
        bad = summary.filter(pl.col("status") != "ok").sort(["model", "replicas"])
        names = model_names(summary)
        notes += [
            _unmeasured_name(r, names)
            + ": "
            + (
                NOT_MEASURED_NOTE
                if r["status"] == NOT_MEASURED
                else r["status"] + (f": {r['reason']}" if r.get("reason") else "")
            )
            for r in bad.iter_rows(named=True)
        ]
    return notes


def _unmeasured_name(row: Mapping[str, Any], names: Mapping[str, tuple[str, float]]) -> str:
    """``OPT-125M × 3 replicas`` or ``OPT-125M advisor plan MPS``: a replication run that was not measured."""
    model = names.get(row["model"], (row["model"],))[0]
    if row.get("plan") == "advisor":
        return f"{model} advisor plan{_mps(row)}"
    return f"{model} × {row['replicas']} replicas"


def _system_vs_sum(runs: pl.DataFrame) -> list[str]:
    """Per model: system throughput and the sum of per-replica rates at each replica count."""
    if "throughput_sum_rps" not in runs.columns or runs["throughput_sum_rps"].is_null().all():
        return ["Sum of per-replica rates: not recorded in this summary."]
    per = []
    size = {name: params for name, params in model_names(runs).values()}
    runs = runs.sort(pl.col("model").replace_strict(size, default=math.inf, return_dtype=pl.Float64), "replicas")
    for (model,), rows in runs.group_by("model", maintain_order=True):
        pairs = ", ".join(
            f"{setup_label(r)} {r['throughput_rps']:.1f} / {r['throughput_sum_rps']:.1f}"
            for r in rows.iter_rows(named=True) if r["throughput_sum_rps"] is not None
        )  # fmt: skip
        per.append(f"{model}: {pairs}")
    return [f"System throughput / sum of per-replica rates (req/s): {'; '.join(per)}."]


def replication_tradeoff(summary: pl.DataFrame) -> tuple[alt.LayerChart, str]:
    """Figure 5: system throughput against latency per model, points labelled by the number of replicas."""
    runs, order = named(ok_runs(summary))
    runs, _ = _with_setup(_finite(runs, TRADEOFF))
    data = runs.select(
        "model", "replicas", "throughput_rps", "latency_mean_s", "setup", "how", *_ci_cols(runs, TRADEOFF),
        series=pl.concat_str("model", "how", separator=" / "),
    )  # fmt: skip
    several = runs["how"].n_unique() > 1  # the advisor's plan or MPS beside the equal split: a shape each
    chart = _tradeoff(
        data, title="Model replication: throughput and latency (Figure 5)", label="replicas", order=order,
        log_x=False, shape="how" if several else None, shape_title="Plan",
    )  # fmt: skip
    what = "Figure 5: system throughput vs mean latency with 1-3 replicas per model on one GPU, labels = replicas"
    if several:
        what += "; a line and marker per plan (the paper's equal split, the batching advisor's, with or without MPS)"
    notes = [*_replication_notes(summary), *_system_vs_sum(runs), *_plan_gains(runs), *point_notes(runs, TRADEOFF)]
    return chart, caption(summary, what, notes)


def _replication_bars(
    summary: pl.DataFrame, y: str, y_title: str, title: str, what: str, notes: Sequence[str] = ()
) -> tuple[alt.LayerChart, str]:
    runs, order = named(ok_runs(summary))
    runs = _finite(runs, [y])
    energy = y == "energy_per_token_j"
    cis = _ci_cols(runs, [y]) if y in CI_METRICS else []
    window = [_window_ok(runs).alias("energy_window_ok")] if energy else []
    runs, setups = _with_setup(runs)
    data = runs.select("model", "replicas", "setup", y, *cis, *window)
    chart = _bars(
        data, y=y, y_title=y_title, title=title, order=order, group="setup", group_order=setups,
        group_title="Replicas" if all(s[1:].isdigit() for s in setups) else "Replicas (plan)",
        text_format=".2g" if energy else ".0f",
    )  # fmt: skip
    notes = [*_replication_notes(summary), *notes, *point_notes(runs, [y]), *(_energy_note(runs) if energy else [])]
    return chart, caption(summary, what, notes, telemetry=[y])


def replication_gpu_util(summary: pl.DataFrame) -> tuple[alt.LayerChart, str]:
    """Figure 6: average GPU utilisation (%) per model and number of replicas."""
    return _replication_bars(
        summary, "gpu_util_mean", "Average GPU utilisation (%)", "GPU utilisation with replicas (Figure 6)",
        "Figure 6: average GPU utilisation, model × replicas on one GPU",
    )  # fmt: skip


def replication_power(summary: pl.DataFrame) -> tuple[alt.LayerChart, str]:
    """Figure 7: average power (W) per model and number of replicas."""
    return _replication_bars(
        summary, "power_w_mean", "Average power (W)", "GPU power with replicas (Figure 7)",
        "Figure 7: average GPU power (W), model × replicas on one GPU",
    )  # fmt: skip


def energy_per_token_replicas(summary: pl.DataFrame) -> tuple[alt.LayerChart, str]:
    """Beyond the paper: GPU energy per output token (J) per model and number of replicas."""
    return _replication_bars(
        summary, "energy_per_token_j", "GPU energy per output token (J)",
        "Energy per token with replicas (beyond the paper)", "Energy per output token, model × replicas on one GPU",
        ["Not in the paper. Energy: NVML's cumulative counter over the window / all replicas' output tokens."],
    )  # fmt: skip


# --- output ---------------------------------------------------------------------------------------


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
