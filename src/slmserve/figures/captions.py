"""Figures: the caption shared by all figures (:func:`caption`: hardware, engine, requests, workload, runs,
models not served, GPU telemetry, what differs from the paper) and the notes on the plotted points
(:func:`point_notes`: repeats, 95% CIs, preemptions; :func:`energy_note`: energy windows).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import polars as pl

from slmserve.analysis import CI_METRICS, ENERGY_MIN_WINDOW_S, NOT_MEASURED
from slmserve.figures.names import model_names, mps_label, ok_runs, plan_size, rate_name

PAPER = "the paper (vLLM 0.1.7, A100 40 GB, real OPT weights)"
NOT_MEASURED_NOTE = "not measured yet (no result file)"
TELEMETRY_SOURCE = "GPU metrics: NVML, sampled every 100 ms over each run's measurement window (the paper: DCGM)"


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
        workload.append(f"arrival rates (req/s): {', '.join(rate_name(r) for r in rates)}")
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
        parts.append(f"advisor plan {plan_size(row)}{mps_label(row)}")
    elif row.get("replicas") is not None:
        parts.append(f"×{row['replicas']}{mps_label(row)}")
    elif row.get("point") is not None:
        parts.append(str(row["point"]))
    elif row.get("batch_size") is not None:
        parts.append(f"b={row['batch_size']}")
    return " ".join(parts)


def ci_cols(runs: pl.DataFrame, metrics: Sequence[str]) -> list[pl.Expr]:
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
            f"{each}.{warmup_counted(hit.iter_rows(named=True))}{said}")  # fmt: skip


def warmup_counted(rows: Iterable[Mapping[str, Any]]) -> str:
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


def energy_note(runs: pl.DataFrame, name: Callable[[Mapping[str, Any]], str] = point_name) -> list[str]:
    """The energy windows of the plotted points (range of the mean window over repeats, and of samples) and
    the points the summary does not trust (``energy_window_ok`` false: a repeat's window shorter than
    ENERGY_MIN_WINDOW_S) or does not say (null), as :func:`window_ok` draws them."""
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
