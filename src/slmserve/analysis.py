"""The telemetry merge: one summary row per measured run (:func:`summarize_runs`), and a
``not_measured`` row per planned run without a result file (:func:`with_not_measured`).

Request metrics are defined in :func:`request_metrics`; GPU metrics are the telemetry reduced over the
same window by :func:`slmserve.telemetry.summarize`; ``energy_per_token_j`` in :func:`summarize_run`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import polars as pl

from slmserve import io, layout, provenance, telemetry
from slmserve.layout import telemetry_path  # callers also reach it as analysis.telemetry_path

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
    "sm_active_mean": _F, "sm_active_max": _F, "sm_occupancy_mean": _F, "sm_occupancy_max": _F,
    "dram_bw_mean": _F, "dram_bw_max": _F, "tensor_active_mean": _F, "tensor_active_max": _F, "gpu_util_mean": _F,
    "gpu_util_max": _F, "sm_clock_mhz_mean": _F, "sm_clock_mhz_max": _F, "power_w_mean": _F,
    "power_w_mean_per_gpu": _F, "energy_j": _F, "mem_used_mb_max": _F, "cpu_util_mean": _F, "n_samples": _I,
    "n_gpus": _I, "nvml_ok": _B, "gpm_ok": _B, "energy_per_token_j": _F,
}  # fmt: skip
RUN_METRICS: dict[str, pl.DataType] = {
    "n_error": _I, "window_start_s": _F, "window_end_s": _F, "duration_s": _F, "output_tokens": _I,
    "latency_p50_s": _F, "latency_p99_s": _F, "ttft_mean_s": _F, "ttft_p50_s": _F, "ttft_p99_s": _F,
    "tpot_mean_s": _F, "peak_inflight": _I, "lag_p99_s": _F, "client_cpu_frac": _F, "client_ok": _B,
}  # fmt: skip
REPLICATION_METRICS: dict[str, pl.DataType] = {"latency_mean_per_replica": pl.List(pl.Float64())}


def complete(summary: pl.DataFrame) -> pl.DataFrame:
    """``summary`` with every metric column of its experiment (typed nulls where no run was measured): a
    replication summary (it has ``replicas``) gets :data:`REPLICATION_METRICS`, the others :data:`RUN_METRICS`."""
    extra = REPLICATION_METRICS if "replicas" in summary.columns else RUN_METRICS
    missing = [pl.lit(None, dtype=t).alias(c) for c, t in {**METRICS, **extra}.items() if c not in summary.columns]
    return summary.with_columns(missing) if missing and summary.width else summary


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


def summarize_run(requests_path: str | os.PathLike[str], models: Mapping[str, Any] | None = None) -> dict:
    """One summary row from a requests parquet and the telemetry parquet beside it: the run's keys and
    provenance, :func:`request_metrics`, the load generator's checks (``client_ok``: arrivals on time, the
    batch limit held, client CPU below :data:`CLIENT_CPU_LIMIT`), the telemetry over the request window
    and ``energy_per_token_j`` = GPU energy in the window / completion tokens."""
    meta = io.read_meta(requests_path)
    run, prov = meta["run"], meta["provenance"]
    entry = (models or {}).get(run["model"], {})
    row: dict[str, Any] = {
        "model": run["model"],
        "family": entry.get("family"),
        "params": entry.get("params"),
        "tp": run["tensor_parallel"],
        "batch_size": run["batch_size"],
        "output_len": run["output_len"],
        "input_len": run["input_len"],
        "arrival_rate": run["arrival_rate"],
        "batch_control": run["batch_control"],
        "prompt_ids_folded_into_vocab": (run.get("extra") or {}).get("prompt_ids_folded_into_vocab"),
        "engine_args": " ".join(run.get("engine_args") or []) or None,
        "status": meta["status"],
        "reason": meta.get("reason"),
        "kv_cache_tokens": (meta.get("server") or {}).get("kv_cache_tokens"),
        "gpu_model": ", ".join(sorted(set(prov.get("gpu_models") or []))) or f"CPU: {prov.get('cpu_model')}",
        "gpu_ids": ",".join(map(str, meta.get("gpu_ids") or [])),
        "engine": prov.get("engine"),
        "engine_version": prov.get("engine_version"),
        "git_sha": prov.get("git_sha"),
        "profile": run.get("profile"),
        "path": str(requests_path),
    }
    if meta["status"] != "ok":
        return row
    req = pl.read_parquet(requests_path)
    row.update(request_metrics(req))
    load = meta.get("load", {})
    row.update(
        peak_inflight=load.get("peak_inflight"),
        lag_p99_s=load.get("lag_p99_s"),
        client_cpu_frac=load.get("client_cpu_frac"),
        preemptions=(meta.get("server_counters") or {}).get("vllm:num_preemptions_total"),
        client_ok=bool(
            load.get("lag_ok", True)
            and load.get("inflight_ok", True)
            and (load.get("client_cpu_frac") or 0.0) < CLIENT_CPU_LIMIT
        ),
    )
    t0 = load.get("t0_mono", 0.0)
    tel = pl.read_parquet(telemetry_path(requests_path))
    if row.get("duration_s") is not None:
        tsum = telemetry.summarize(tel, t0 + row["window_start_s"], t0 + row["window_end_s"])
        row.update(tsum)
        energy = tsum.get("energy_j")
        row["energy_per_token_j"] = energy / row["output_tokens"] if energy and row["output_tokens"] else None
    return row


def summarize_runs(paths: Iterable[str | os.PathLike[str]], models: Mapping[str, Any] | None = None) -> pl.DataFrame:
    rows = [summarize_run(p, models) for p in paths]
    if not rows:
        return pl.DataFrame()
    return complete(pl.DataFrame(rows, infer_schema_length=None).sort(["model", "tp", "output_len", "batch_size"]))


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
        row.update(replicas=int(key["n"]), batch_per_replica=None)
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
    io.write_parquet(summary, path, {"provenance": provenance.collect(dict(config)), "rows": summary.height})
