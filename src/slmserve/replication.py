"""Model replication on one GPU (paper, section 4.2; Figures 5-7).

``n`` vLLM servers of the same model share one GPU: each gets ``memory_share / n`` of its memory, a batch
of ``one-GPU maximum // n`` (``--max-num-seqs``) and an even part of the requests, all sent at once to
all replicas. The servers start one after another (vLLM checks free memory at start-up), then the
replicas are loaded together, ``repeats`` times.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path
from typing import Any

import polars as pl

from slmserve import analysis, layout, telemetry
from slmserve.gpuslots import GpuSlots
from slmserve.jobguard import guard
from slmserve.measure import Measurement, batch_fits, header, measure, write_point, write_unmeasured
from slmserve.runner import SweepJob, load_prompts, load_spec, server_spec, wants_repeat
from slmserve.server import InfeasibleError, VllmServer

log = logging.getLogger(__name__)


def split_evenly(n: int, parts: int) -> list[range]:
    """``range(n)`` cut into ``parts`` contiguous pieces whose sizes differ by at most one."""
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def run_replication(job: SweepJob, replicas: int, one_gpu_max: int, out: Path) -> dict[str, Any]:
    """Run ``replicas`` servers of ``job.model`` on one GPU; write ``out`` (requests of all replicas,
    column ``replica``) and the telemetry beside it (:func:`slmserve.analysis.telemetry_path`)."""
    batch = one_gpu_max // replicas
    paths = (out, layout.telemetry_path(out))
    with guard([out], f"{job.model} x{replicas}"):
        prompts = load_prompts(job)
        with GpuSlots(1, label=f"{job.model} x{replicas}") as alloc:
            run = {**job.describe(), "replicas": replicas, "batch_per_replica": batch,
                   "one_gpu_max_batch": one_gpu_max, "batch_sizes": None}  # fmt: skip
            head = header(run, alloc.ids, alloc.nvml_indices)
            if batch < 1:
                return write_unmeasured(paths, head, f"one-GPU maximum batch {one_gpu_max} < {replicas} replicas")
            share = dataclasses.replace(
                job,
                memory_share=job.memory_share / replicas,
                memory_budget_gb=job.memory_budget_gb / replicas if job.memory_budget_gb else None,
                cpu_kv_cache_gb=job.cpu_kv_cache_gb / replicas,
                batch_control="restart",
            )
            with contextlib.ExitStack() as stack:
                servers: list[VllmServer] = []
                try:
                    for i in range(replicas):
                        spec = server_spec(share, alloc, batch, f"r{replicas}-{i}")
                        servers.append(stack.enter_context(VllmServer(spec)))
                except InfeasibleError as exc:
                    return write_unmeasured(paths, head, f"replica {len(servers)}: {exc.reason}")
                for i, srv in enumerate(servers):
                    reason = batch_fits(batch, srv, job.input_len, job.output_len, job.fits)
                    if reason is not None:
                        return write_unmeasured(paths, head, f"replica {i}: {reason}")
                parts = split_evenly(prompts.height, replicas)
                specs = [load_spec(share, srv, batch, prompts[p.start : p.stop], replica=i)
                         for i, (srv, p) in enumerate(zip(servers, parts, strict=True))]  # fmt: skip
                runs: list[Measurement] = []
                while wants_repeat([m.wall_s for m in runs], job.repeats, job.repeat_budget_s):
                    runs.append(measure(servers, specs, alloc.nvml_indices, interval_s=job.telemetry_interval_s,
                                        sample=job.telemetry_enabled, where=""))  # fmt: skip
                meta = write_point(paths, head, runs)
                log.info("%s x%d: %d repeats, %s requests done", job.model, replicas, len(runs),
                         [ld["n_ok"] for ld in runs[-1].meta["loads"]])  # fmt: skip
                return meta


def _replication_row(meta: dict[str, Any], path: str, models: dict[str, Any] | None) -> dict[str, Any]:
    run, prov = meta["run"], meta["provenance"]
    entry = (models or {}).get(run["model"], {})
    return {
        "model": run["model"], "family": entry.get("family"), "params": entry.get("params"),
        "replicas": run["replicas"], "batch_per_replica": run["batch_per_replica"],
        "input_len": run["input_len"], "output_len": run["output_len"],
        "status": meta["status"], "reason": meta.get("reason"),
        "gpu_model": analysis.gpu_model(prov),
        "engine": prov.get("engine"), "engine_version": prov.get("engine_version"), "path": path,
    }  # fmt: skip


def repeat_metrics(req: pl.DataFrame, rep: dict[str, Any], tel: pl.DataFrame) -> dict[str, Any]:
    """Metrics of one repeat of a replication run (request times on the replicas' common clock):

    * ``throughput_rps`` (system throughput, the headline) = all replicas' completed requests / (last end -
      first send over all replicas); ``output_tok_s`` likewise with output tokens;
    * ``throughput_sum_rps`` = the sum of each replica's own rate (its requests over its own window), the
      paper's way of adding replicas up; it exceeds the system throughput when replicas end at different times;
    * ``latency_mean_s`` = the largest replica mean (as in the paper), ``latency_mean_per_replica`` each one;
    * telemetry over the common window; ``energy_per_token_j`` = GPU energy / all output tokens.
    """
    per = [analysis.request_metrics(g) for _, g in sorted(req.group_by("replica"), key=lambda kv: kv[0])]
    whole = analysis.request_metrics(req)
    row: dict[str, Any] = {
        "n_ok": whole["n_ok"],
        "throughput_rps": whole["throughput_rps"],
        "output_tok_s": whole.get("output_tok_s"),
        "throughput_sum_rps": sum(p["throughput_rps"] or 0.0 for p in per),
        "latency_mean_s": max(p["latency_mean_s"] for p in per),
        "latency_mean_per_replica": [p["latency_mean_s"] for p in per],
        "preemptions": sum((c or {}).get("vllm:num_preemptions_total", 0.0) for c in rep.get("server_counters") or []),
        "effective_batch": sum((e or {}).get("effective_batch") or 0.0 for e in rep.get("engine") or []) or None,
    }
    t0 = rep.get("t0_mono") or 0.0
    tsum = telemetry.summarize(tel, t0 + whole["window_start_s"], t0 + whole["window_end_s"])
    row.update(tsum)
    row.update(analysis.energy_metrics(tsum.get("energy_j"), whole.get("output_tokens"), whole["duration_s"],
                                       tsum["n_samples"]))  # fmt: skip
    return row


def summarize_repeats(path: str | Path, models: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One summary row per repeat of a replication run (:func:`repeat_metrics`)."""
    return analysis.repeat_rows(path, _replication_row, repeat_metrics, models)


def summarize_runs(paths: list[str | Path], models: dict[str, Any] | None = None) -> pl.DataFrame:
    """One row per replication run: its repeats' means with n and 95% CIs (:func:`slmserve.analysis.points`)."""
    rows = [r for p in paths for r in summarize_repeats(p, models)]
    if not rows:
        return pl.DataFrame()
    return analysis.complete(analysis.points(pl.DataFrame(rows, infer_schema_length=None)).sort("model", "replicas"))
