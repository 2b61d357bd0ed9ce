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

from slmserve import analysis, io, telemetry
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
    paths = (out, analysis.telemetry_path(out))
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


def summarize(path: str | Path, models: dict[str, Any] | None = None) -> dict[str, Any]:
    """One summary row of a replication run: throughput summed over replicas, latency = the largest
    replica mean, telemetry over the whole window."""
    meta = io.read_meta(path)
    run, prov = meta["run"], meta["provenance"]
    entry = (models or {}).get(run["model"], {})
    row: dict[str, Any] = {
        "model": run["model"], "family": entry.get("family"), "params": entry.get("params"),
        "replicas": run["replicas"], "batch_per_replica": run["batch_per_replica"],
        "input_len": run["input_len"], "output_len": run["output_len"],
        "status": meta["status"], "reason": meta.get("reason"),
        "gpu_model": ", ".join(sorted(set(prov.get("gpu_models") or []))) or f"CPU: {prov.get('cpu_model')}",
        "engine": prov.get("engine"), "engine_version": prov.get("engine_version"), "path": str(path),
    }  # fmt: skip
    if meta["status"] != "ok":
        return row
    req = pl.read_parquet(path)
    per = [analysis.request_metrics(g) for _, g in sorted(req.group_by("replica"), key=lambda kv: kv[0])]
    row.update(
        n_ok=sum(p["n_ok"] for p in per),
        throughput_rps=sum(p["throughput_rps"] or 0.0 for p in per),
        output_tok_s=sum(p["output_tok_s"] or 0.0 for p in per),
        latency_mean_s=max(p["latency_mean_s"] for p in per),
        latency_mean_per_replica=[p["latency_mean_s"] for p in per],
        preemptions=sum(c.get("vllm:num_preemptions_total", 0.0) for c in meta.get("server_counters", [])),
    )
    whole = analysis.request_metrics(req)
    tel = pl.read_parquet(analysis.telemetry_path(path))
    t0 = meta["t0_mono"]
    tsum = telemetry.summarize(tel, t0 + whole["window_start_s"], t0 + whole["window_end_s"])
    row.update(tsum)
    energy, tokens = tsum.get("energy_j"), whole.get("output_tokens")
    row["energy_per_token_j"] = energy / tokens if energy and tokens else None
    return row


def summarize_runs(paths: list[str | Path], models: dict[str, Any] | None = None) -> pl.DataFrame:
    rows = [summarize(p, models) for p in paths]
    return (
        analysis.complete(pl.DataFrame(rows, infer_schema_length=None).sort("model", "replicas"))
        if rows
        else pl.DataFrame()
    )
