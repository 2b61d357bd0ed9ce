"""The telemetry merge: one summary row per repeat of a point (:func:`summarize_repeats`), one per point
(:func:`points`: means, n and 95% CIs), and a ``not_measured`` row per planned run without a result file
(:func:`with_not_measured`).

Request metrics are defined in :func:`request_metrics`; GPU metrics are the telemetry reduced over the
same window by :func:`slmserve.telemetry.summarize`; energy per token in :func:`energy_metrics`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import polars as pl

from slmserve import io, layout, measure, provenance, stats, telemetry
from slmserve.layout import telemetry_path

# A run whose load generator used more than this share of one core may have been client-bound.
CLIENT_CPU_LIMIT = 0.9
# Status of a planned run that has no result file (re-plotting a campaign that is not finished).
NOT_MEASURED = "not_measured"
_SORT = ("model", "tp", "output_len", "arrival_rate", "batch_size", "replicas")
# What a measured run adds to its summary row: a summary in which no run was measured (all infeasible,
# unsupported or not measured yet) lacks these columns. Telemetry and request metrics of every experiment,
# then those of one run on one server (sweeps, points) and of a replication run.
_F, _I, _B = pl.Float64(), pl.Int64(), pl.Boolean()
METRICS: dict[str, pl.DataType] = {
    "n_ok": _I, "throughput_rps": _F, "output_tok_s": _F, "latency_mean_s": _F, "preemptions": _F,
    "preemptions_measured_only": _B,
    "sm_active_mean": _F, "sm_active_max": _F, "sm_occupancy_mean": _F, "sm_occupancy_max": _F,
    "dram_bw_mean": _F, "dram_bw_max": _F, "tensor_active_mean": _F, "tensor_active_max": _F, "gpu_util_mean": _F,
    "gpu_util_max": _F, "sm_clock_mhz_mean": _F, "sm_clock_mhz_max": _F, "power_w_mean": _F,
    "power_w_mean_per_gpu": _F, "energy_j": _F, "mem_used_mb_max": _F, "cpu_util_mean": _F, "n_samples": _I,
    "n_gpus": _I, "nvml_ok": _B, "gpm_ok": _B, "energy_per_token_j": _F, "energy_window_s": _F,
    "energy_samples": _I, "energy_window_ok": _B, "effective_batch": _F, "gauge_samples": _I, "beside": pl.String(),
    "n_beside": _I, "host_steal_frac": _F, "host_speed_repeat_ms": _F,
}  # fmt: skip
RUN_METRICS: dict[str, pl.DataType] = {
    "n_error": _I, "window_start_s": _F, "window_end_s": _F, "duration_s": _F, "output_tokens": _I,
    "latency_p50_s": _F, "latency_p99_s": _F, "ttft_mean_s": _F, "ttft_p50_s": _F, "ttft_p99_s": _F,
    "tpot_mean_s": _F, "peak_inflight": _I, "lag_p99_s": _F, "client_cpu_frac": _F, "client_ok": _B,
    "running_max": _F,
}  # fmt: skip
REPLICATION_METRICS: dict[str, pl.DataType] = {
    "latency_mean_per_replica": pl.List(pl.Float64()), "throughput_sum_rps": _F,
}  # fmt: skip


def complete(summary: pl.DataFrame) -> pl.DataFrame:
    """``summary`` with every metric column of its experiment (typed nulls where no run was measured, or where
    no measured run recorded the metric, e.g. files older than it): a replication summary (it has ``replicas``)
    gets :data:`REPLICATION_METRICS`, the others :data:`RUN_METRICS`."""
    extra = REPLICATION_METRICS if "replicas" in summary.columns else RUN_METRICS
    typed = {**METRICS, **extra}
    fix = [pl.lit(None, dtype=t).alias(c) for c, t in typed.items()
           if c not in summary.columns or summary.schema[c] == pl.Null]  # fmt: skip
    return summary.with_columns(fix) if fix and summary.width else summary


def _q(s: pl.Series, q: float) -> float | None:
    return None if s.is_empty() else float(s.quantile(q, interpolation="linear"))


def _mean(s: pl.Series) -> float | None:
    s = s.drop_nulls()
    return None if s.is_empty() else float(s.mean())  # type: ignore[arg-type]


def request_metrics(req: pl.DataFrame) -> dict[str, Any]:
    """Request metrics of one run, over the requests with status ok; the window runs from the first send
    to the last end (``window_start_s``, ``window_end_s``, ``duration_s`` = end - start), on the clock
    of the telemetry:

    - ``throughput_rps`` = completed requests / duration (the paper's throughput)
    - ``output_tok_s`` = completion tokens / duration
    - ``latency_*``: mean, p50, p99 of ``end - scheduled arrival`` (the paper's latency is the mean)
    - ``ttft_*``: of ``first token - scheduled arrival``; ``tpot_mean_s``: mean of
      ``(end - first token) / (completion tokens - 1)`` (columns of :func:`slmserve.loadgen.to_frame`)

    Quantiles are linear; a duration of 0 gives null rates."""
    ok = req.filter(pl.col("status") == "ok")
    if ok.is_empty():
        return {"n_ok": 0, "n_error": req.height, "duration_s": None, "throughput_rps": None}
    start, end = float(ok["sent_s"].min()), float(ok["end_s"].max())  # type: ignore[arg-type]
    dur = end - start
    out_tokens = int(ok["completion_tokens"].sum())
    return {
        "n_ok": ok.height,
        "n_error": req.height - ok.height,
        "window_start_s": start,
        "window_end_s": end,
        "duration_s": dur,
        "throughput_rps": ok.height / dur if dur > 0 else None,
        "output_tokens": out_tokens,
        "output_tok_s": out_tokens / dur if dur > 0 else None,
        "latency_mean_s": _mean(ok["latency_s"]),
        "latency_p50_s": _q(ok["latency_s"], 0.5),
        "latency_p99_s": _q(ok["latency_s"], 0.99),
        "ttft_mean_s": _mean(ok["ttft_s"]),
        "ttft_p50_s": _q(ok["ttft_s"].drop_nulls(), 0.5),
        "ttft_p99_s": _q(ok["ttft_s"].drop_nulls(), 0.99),
        "tpot_mean_s": _mean(ok["tpot_s"]),
    }


# What the metadata of a sweep's or output-length point's result must hold (run.model: meta["run"]["model"]).
RUN_KEYS = ("run.model", "run.tensor_parallel", "run.batch_size", "run.output_len", "run.input_len",
            "run.arrival_rate", "run.batch_control")  # fmt: skip


def require(meta: Mapping[str, Any], path: str | os.PathLike[str], keys: Iterable[str]) -> None:
    """Raise ValueError naming ``path`` and each of ``keys`` (dotted, ``run.model``) that its metadata lacks,
    and what to do: a file without them is a broken or foreign result, not a slmserve point."""
    missing = [key for key in keys if not _has(meta, key)]
    if missing:
        raise ValueError(
            f"{path}: the result's slmserve metadata has no {', '.join(missing)}: the file is incomplete or not a "
            "slmserve result; re-measure the point (delete the file and rerun its rule), or remove it from results/"
        )


def _has(meta: Mapping[str, Any], key: str) -> bool:
    """Whether the dotted ``key`` is in ``meta``: a run setting may be null (``run.batch_size`` of a replica),
    a top-level key (``status``, ``run``, ``provenance``) may not."""
    node: Any = meta
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return node is not None or "." in key


def _run_row(meta: Mapping[str, Any], path: str, models: Mapping[str, Any] | None) -> dict[str, Any]:
    """The key and provenance columns of a point's summary rows."""
    require(meta, path, ("provenance", *RUN_KEYS))
    run, prov = meta["run"], meta["provenance"]
    entry = (models or {}).get(run["model"], {})
    servers = [s for r in measure.repeats_of(meta) for s in r.get("servers") or [] if s] or [meta.get("server") or {}]
    kv_tokens = [s["kv_cache_tokens"] for s in servers if s.get("kv_cache_tokens") is not None]
    return {
        "model": run["model"],
        "family": entry.get("family"),
        "params": entry.get("params"),
        "tp": run["tensor_parallel"],
        "batch_size": run["batch_size"],
        "output_len": run["output_len"],
        "input_len": run["input_len"],
        "arrival_rate": run["arrival_rate"],
        "batch_control": run["batch_control"],
        "fits": run.get("fits"),
        "prompt_ids_folded_into_vocab": (run.get("extra") or {}).get("prompt_ids_folded_into_vocab"),
        "engine_args": " ".join(run.get("engine_args") or []) or None,
        "status": meta["status"],
        "reason": meta.get("reason"),
        # a point resumed on another machine had two servers: the KV cache every repeat had at least
        "kv_cache_tokens": min(kv_tokens, default=None),
        "gpu_model": gpu_model(prov),
        "gpu_ids": repeat_gpu_ids(meta),
        "engine": prov.get("engine"),
        "engine_version": prov.get("engine_version"),
        "git_sha": _repeat_shas(meta),
        "profile": run.get("profile"),
        "path": path,
    }


def repeat_gpu_ids(meta: Mapping[str, Any]) -> str:
    """The GPU ids (``CUDA_VISIBLE_DEVICES``) that measured the point, ``"0"`` or ``"0,1"`` for one set: each
    repeat's own, recorded with it since 2026-11-26, else the file's (a repeat saved before then did not record
    them; its provenance's NVML indices are another numbering); several sets in order, joined by ``" | "``."""
    own = [str(i) for i in meta.get("gpu_ids") or []]
    sets = [",".join(str(i) for i in r.get("gpu_ids", own)) for r in measure.repeats_of(meta)]
    return " | ".join(dict.fromkeys(sets or [",".join(own)]))


def _repeat_shas(meta: Mapping[str, Any]) -> str | None:
    """The code versions that measured the point: each repeat's own (one resumed from an earlier job keeps
    that job's provenance, slmserve.journal), else the file's; distinct, sorted, comma-separated."""
    own = meta["provenance"].get("git_sha")
    shas = {(r.get("provenance") or {}).get("git_sha") or own for r in measure.repeats_of(meta)} or {own}
    return ",".join(sorted(s for s in shas if s)) or None


def measured_only(rep: Mapping[str, Any]) -> bool:
    """Whether a repeat's server counters (``preemptions``) span its measured requests only; a repeat written
    before 2026-11-29 read them before its warm-up, so its count includes the warm-up's requests (an upper
    bound of the measured requests' count; a 0 is still 0)."""
    return rep.get("counters_after_warmup") is True


def _repeat_metrics(req: pl.DataFrame, rep: Mapping[str, Any], tel: pl.DataFrame) -> dict[str, Any]:
    """Request, client, engine and telemetry metrics of one repeat of a point on one server."""
    row = request_metrics(req)
    load = (rep.get("loads") or [{}])[0]
    engine = (rep.get("engine") or [{}])[0] or {}
    row.update(
        peak_inflight=load.get("peak_inflight"),
        lag_p99_s=load.get("lag_p99_s"),
        client_cpu_frac=load.get("client_cpu_frac"),
        preemptions=((rep.get("server_counters") or [{}])[0] or {}).get("vllm:num_preemptions_total"),
        preemptions_measured_only=measured_only(rep),
        effective_batch=engine.get("effective_batch"),
        gauge_samples=engine.get("gauge_samples"),
        running_max=engine.get("running_max"),
        beside=beside_text(rep),
        host_steal_frac=rep.get("host_steal_frac"),  # telemetry.steal_frac over the measured phase
        host_speed_repeat_ms=host_speed_of(rep),
        client_ok=bool(
            load.get("lag_ok", True)
            and load.get("inflight_ok", True)
            and (load.get("client_cpu_frac") or 0.0) < CLIENT_CPU_LIMIT
        ),
    )
    if row.get("duration_s") is not None:
        t0 = rep.get("t0_mono") or 0.0
        tsum = telemetry.summarize(tel, t0 + row["window_start_s"], t0 + row["window_end_s"])
        row.update(tsum)
        row.update(energy_metrics(tsum.get("energy_j"), row["output_tokens"], row["duration_s"], tsum["n_samples"]))
    return row


def host_speed_of(rep: Mapping[str, Any]) -> float | None:
    """``host_speed_repeat_ms``, the host's Python speed around one repeat (lower is faster): the mean of
    :func:`slmserve.provenance.time_host_ms` just before its loads and just after them
    (``(host_speed_before_ms + host_speed_after_ms) / 2``, :func:`slmserve.measure.measure`); None for a
    repeat without both (files written before commit 094ee05, 2026-11-29)."""
    before, after = rep.get("host_speed_before_ms"), rep.get("host_speed_after_ms")
    return None if before is None or after is None else (before + after) / 2


def beside_text(rep: Mapping[str, Any]) -> str | None:
    """The other GPU jobs a repeat ran beside on its host (its ``beside``, :func:`slmserve.measure.measure`),
    as ``"<label> on GPU <ids>"`` joined by ``"; "``; ``""`` when it ran alone, None where not recorded."""
    if "beside" not in rep:
        return None
    jobs = rep.get("beside") or []
    return "; ".join(f"{j.get('label') or 'a job'} on GPU{'s' * (len(j.get('gpus') or []) > 1)} "
                     f"{','.join(j.get('gpus') or [])}" for j in jobs)  # fmt: skip


# A window shorter than this holds too few telemetry samples (and power readings that lag a changing load)
# for an energy figure to be trusted: the summary flags it (energy_window_ok false).
ENERGY_MIN_WINDOW_S = 10.0


def energy_metrics(energy_j: float | None, output_tokens: int | None, window_s: float, n_samples: int) -> dict:
    """``energy_per_token_j`` = GPU energy over the measurement window (NVML's cumulative counter read at the
    window's edges, all GPUs: :func:`slmserve.telemetry.counter_energy_j`) / output tokens; with the window
    (``energy_window_s``), its sample count (``energy_samples``) and ``energy_window_ok`` = window >=
    ENERGY_MIN_WINDOW_S."""
    return {
        "energy_per_token_j": energy_j / output_tokens if energy_j and output_tokens else None,
        "energy_window_s": window_s,
        "energy_samples": n_samples,
        "energy_window_ok": window_s >= ENERGY_MIN_WINDOW_S,
    }


def gpu_model(prov: Mapping[str, Any]) -> str:
    """The GPU models of a result's provenance, or its host CPU on the CPU engine."""
    return ", ".join(sorted(set(prov.get("gpu_models") or []))) or f"CPU: {prov.get('cpu_model')}"


RowFn = Callable[[Mapping[str, Any], str, Mapping[str, Any] | None], dict[str, Any]]
MetricsFn = Callable[[pl.DataFrame, Mapping[str, Any], pl.DataFrame], dict[str, Any]]


def repeat_rows(path: str | os.PathLike[str], base: RowFn, metrics: MetricsFn,
                models: Mapping[str, Any] | None = None) -> list[dict]:  # fmt: skip
    """One summary row per repeat of a result file (column ``repeat``): ``base`` (keys, provenance) and
    ``metrics`` of that repeat's requests, metadata and telemetry; one row without metrics for a result
    that was not measured."""
    meta = io.read_meta(path)
    require(meta, path, ["status"])
    row = base(meta, str(path), models)
    if meta["status"] != "ok":
        return [row]
    req = io.read_table(path)
    tel = io.read_table(telemetry_path(path))
    rows = []
    for rep in measure.repeats_of(meta):
        i = rep["repeat"]
        mine = req.filter(pl.col("repeat") == i) if "repeat" in req.columns else req
        tel_i = tel.filter(pl.col("repeat") == i) if "repeat" in tel.columns else tel
        # where the repeat ran: its own (resumed, slmserve.journal), else the file's; None in older files
        machine = rep.get("machine") or (rep.get("provenance") or meta.get("provenance") or {}).get("machine")
        rows.append({**row, "repeat": i, "machine": machine, **metrics(mine, rep, tel_i)})
    return rows


def summarize_repeats(requests_path: str | os.PathLike[str], models: Mapping[str, Any] | None = None) -> list[dict]:
    """One summary row per repeat of a point (:func:`repeat_rows` of a sweep or output-length result)."""
    return repeat_rows(requests_path, _run_row, _repeat_metrics, models)


def summarize_run(requests_path: str | os.PathLike[str], models: Mapping[str, Any] | None = None) -> dict:
    """The summary row of a point: its repeats' metrics as means, with n and 95% CIs (:func:`points`)."""
    return points(pl.DataFrame(summarize_repeats(requests_path, models), infer_schema_length=None)).row(0, named=True)


def summarize_runs(paths: Iterable[str | os.PathLike[str]], models: Mapping[str, Any] | None = None) -> pl.DataFrame:
    """One row per point (:func:`points`) of every run file in ``paths``."""
    rows = [r for p in paths for r in summarize_repeats(p, models)]
    if not rows:
        return pl.DataFrame()
    frame = points(pl.DataFrame(rows, infer_schema_length=None))
    return complete(frame.sort(["model", "tp", "output_len", "batch_size"]))


# Metrics reported with their spread over repeats: ``<m>`` is the mean, ``<m>_sd``, ``<m>_ci_lo`` and
# ``<m>_ci_hi`` the sample SD and the 95% CI (:mod:`slmserve.stats`) over ``<m>_n`` values; ``n_repeats``
# counts the repeats (more than ``<m>_n`` where a repeat has no value, e.g. no telemetry). Every metric a
# figure plots is here.
CI_METRICS = (
    "throughput_rps", "output_tok_s", "throughput_sum_rps", "latency_mean_s", "latency_p50_s", "latency_p99_s",
    "ttft_mean_s", "tpot_mean_s", "power_w_mean", "energy_per_token_j", "gpu_util_mean", "sm_active_mean",
    "sm_active_max", "sm_occupancy_mean", "sm_occupancy_max", "dram_bw_mean", "dram_bw_max", "effective_batch",
)  # fmt: skip
# per-repeat counts: the point reports the smallest
_WORST_LOW = ("n_ok", "peak_inflight", "n_samples", "gauge_samples")
# Known only where every repeat has it: a mean over the repeats with a value would read as the point's count.
_EVERY_REPEAT = ("preemptions",)


def _agg(col: str, dtype: pl.DataType) -> pl.Expr:
    """How :func:`points` reduces the repeats' values of ``col`` (see there)."""
    c = pl.col(col)
    if col in _WORST_LOW:
        return c.min()
    if col == "n_error":
        return c.max()
    if col in _EVERY_REPEAT:
        return pl.when(c.null_count() == 0).then(c.mean())
    if col.endswith("_max"):  # each repeat's largest sample, averaged as every other metric
        return c.cast(pl.Float64).mean()
    if dtype == pl.Boolean:  # a point without repeats (not measured) keeps a null flag
        return pl.when(c.count() > 0).then(c.all())
    if dtype.is_float():
        return c.mean()
    if dtype.is_integer():  # a count or size that differs between repeats (energy samples): the smallest
        return c.min()
    return c.first()


def mean_per_position(lists: Sequence[Sequence[float | None] | None], what: str) -> list[float | None] | None:
    """The element-wise mean of a point's per-repeat lists (``latency_mean_per_replica``: element ``i`` =
    replica ``i``'s mean latency averaged over the repeats); null where a repeat lacks the list, an element
    null where a repeat lacks that value. Lists of different lengths raise ValueError (``what`` names them)."""
    if not lists or any(x is None for x in lists):
        return None
    sizes = sorted({len(x) for x in lists})
    if len(sizes) > 1:
        raise ValueError(f"{what}: the repeats hold {' and '.join(map(str, sizes))} values, one per replica is "
                         "expected in every repeat; the result file is inconsistent, re-measure the point")  # fmt: skip
    columns = zip(*lists, strict=True)
    return [None if None in col else math.fsum(col) / len(col) for col in columns]


def points(repeats: pl.DataFrame) -> pl.DataFrame:
    """One row per point (per result file, ``path``) from its repeats' rows: each metric's mean over repeats
    (a ``<m>_max`` too: the mean of each repeat's largest sample, not the largest of all repeats; counts and
    other integers: the smallest, errors the largest; flags: all true; ``preemptions``: the mean, null where
    a repeat has no count, e.g. a failed /metrics read; a list, as ``latency_mean_per_replica``: the
    element-wise mean, :func:`mean_per_position`), ``n_repeats``, ``n_machines`` (how many machines its
    repeats ran on, where they recorded it; a job resumed elsewhere gives 2), ``machines`` (their ids,
    sorted, comma-separated), for :data:`CI_METRICS` the number of values, SD and 95% CI, and where repeats
    recorded the jobs beside them, ``beside`` (every such job once) and ``n_beside`` (the repeats that had
    one)."""
    if "repeat" not in repeats.columns:
        repeats = repeats.with_columns(repeat=pl.lit(None, pl.Int64))
    if "machine" not in repeats.columns:
        repeats = repeats.with_columns(machine=pl.lit(None, pl.String))
    machines = pl.col("machine").drop_nulls()
    lists = {c: t for c, t in repeats.schema.items() if isinstance(t, pl.List)}
    own = ("path", "repeat", "machine", "beside", *lists)
    aggs = [_agg(c, t).alias(c) for c, t in repeats.schema.items() if c not in own]
    out = repeats.group_by("path", maintain_order=True).agg(
        *aggs, n_repeats=pl.col("repeat").count(),
        n_machines=pl.when(machines.count() > 0).then(machines.n_unique()),
        machines=pl.when(machines.count() > 0).then(machines.unique().sort().str.join(", ")),
    )  # fmt: skip
    spread, per_position = [], {c: [] for c in lists}
    for (path,), group in repeats.group_by("path", maintain_order=True):
        row: dict[str, Any] = {}
        for m in CI_METRICS:
            if m in group.columns:
                try:
                    d = stats.describe(group[m].to_list())
                except ValueError as exc:
                    raise ValueError(f"{path}: {m}: {exc}") from None
                row.update({f"{m}_n": d["n"], f"{m}_sd": d["sd"], f"{m}_ci_lo": d["ci_lo"], f"{m}_ci_hi": d["ci_hi"]})
        if "beside" in group.columns:
            row.update(beside_of(group["beside"].to_list()))
        for c in lists:
            per_position[c].append(mean_per_position(group[c].to_list(), f"{path}: {c}"))
        spread.append(row)
    out = out.with_columns(pl.Series(c, per_position[c], dtype=t) for c, t in lists.items())
    extra = pl.DataFrame(spread, infer_schema_length=None)
    extra = extra.with_columns(pl.col(c).cast(t) for c, t in (("beside", pl.String), ("n_beside", pl.Int64))
                               if c in extra.columns)  # fmt: skip
    order = [c for c in repeats.columns if c not in ("repeat", "machine", "beside")]
    out = out.select([*order, "n_repeats", "n_machines", "machines"])
    return pl.concat([out, extra], how="horizontal") if extra.width else out


def beside_of(texts: Sequence[str | None]) -> dict[str, Any]:
    """A point's ``beside`` (each job its repeats ran beside, once, sorted) and ``n_beside`` from its repeats'
    :func:`beside_text`; both None where no repeat recorded it."""
    recorded = [t for t in texts if t is not None]
    if not recorded:
        return {"beside": None, "n_beside": None}
    jobs = sorted({j for t in recorded for j in t.split("; ") if j})
    return {"beside": "; ".join(jobs), "n_beside": sum(1 for t in recorded if t)}


def planned_row(path: str | os.PathLike[str], models: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The summary row of a planned run without a result file, its keys read from the path (status
    ``not_measured``): captions count and name it, figures leave it out."""
    text = str(path)
    try:
        kind, key = layout.parse(text)
    except ValueError:
        kind, key = None, {}
    if kind not in layout.MEASURED:
        raise ValueError(f"{text}: not a result path of the workflow (runs/, points/ or replication/)")
    entry = (models or {}).get(key["model"], {})
    row: dict[str, Any] = {"model": key["model"], "family": entry.get("family"), "params": entry.get("params")}
    # a replica's and a point's batch come from a capacity probe, not from the path: null
    if kind == "replication":
        row.update(replicas=int(key["n"]), batch_per_replica=None, plan="equal")
    elif kind == "plan":  # the advisor's replicas and batch come from its table, not from the path
        row.update(replicas=None, batch_per_replica=None, plan="advisor", mps=key["variant"] == "mps")
    else:
        bs = key.get("bs")
        row.update(tp=int(key["tp"]), output_len=int(key["out"]), batch_size=int(bs) if bs is not None else None)
        row["arrival_rate"] = math.inf if key["rate"] == "inf" else float(key["rate"])
    row.update(status=NOT_MEASURED, reason="not measured yet: no result file", path=text)
    return row


def with_not_measured(
    summary: pl.DataFrame, missing: Sequence[str | os.PathLike[str]], models: Mapping[str, Any] | None = None
) -> pl.DataFrame:
    """``summary`` plus one ``not_measured`` row per path in ``missing`` (see :func:`planned_row`), with
    every metric column (:func:`complete`) even when nothing was measured."""
    if not missing:
        return summary
    planned = pl.DataFrame([planned_row(p, models) for p in missing], infer_schema_length=None)
    both = pl.concat([summary, planned], how="diagonal_relaxed") if summary.height else planned
    keys = [c for c in _SORT if c in both.columns]
    return complete(both.sort(keys, nulls_last=True))


def write_summary(summary: pl.DataFrame, path: str | os.PathLike[str], config: Mapping[str, Any]) -> None:
    """Write a summary with the provenance of its measurements (each row's engine, GPU and git SHA; the
    config hash), nothing of the re-plot itself: re-plotting unchanged results rewrites identical bytes."""
    shas = summary["git_sha"].drop_nulls().to_list() if "git_sha" in summary.columns else []
    sha = sorted({one for row in shas for one in row.split(",")})  # a row lists each version of its repeats
    meta = {"config_hash": provenance.config_hash(dict(config)), "rows": summary.height, "measured_git_sha": sha}
    io.write_parquet(summary, path, meta)
