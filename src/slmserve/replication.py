"""Model replication on one GPU (paper, section 4.2; Figures 5-7).

``n`` vLLM servers of the same model share one GPU: each gets ``memory_share / n`` of its memory (shares
adding to 90%), a batch of ``one-GPU maximum // n`` (``--max-num-seqs``), and an even part of the
requests; all requests are sent at once to all replicas. The servers start one after another (vLLM
checks free memory at start-up), then the replicas are loaded together. Overall throughput is the sum
over replicas; latency is the largest replica mean.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from pathlib import Path
from typing import Any

import polars as pl

from slmserve import analysis, capacity, io, provenance, telemetry
from slmserve.gpuslots import GpuSlots
from slmserve.loadgen import LoadResult, LoadSpec, result_meta, to_frame
from slmserve.runner import (
    COUNTERS,
    SweepJob,
    _guarded_load,
    _server_spec,
    check_load,
    load_prompts,
    server_died,
    to_frame_empty,
    warmup_for,
)
from slmserve.server import InfeasibleError, ServerError, VllmServer, install_signal_handlers

log = logging.getLogger(__name__)

TIME_COLS = ("scheduled_s", "sent_s", "first_token_s", "end_s")


def split_evenly(n: int, parts: int) -> list[range]:
    """``range(n)`` cut into ``parts`` contiguous pieces whose sizes differ by at most one."""
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def merge_replicas(results: list[LoadResult]) -> pl.DataFrame:
    """One requests frame for all replicas, times rebased to the earliest replica's t0."""
    t0 = min(r.t0_mono for r in results)
    frames = [
        to_frame(r).with_columns([pl.col(c) + (r.t0_mono - t0) for c in TIME_COLS])
        # latency/ttft are differences and need no shift
        for r in results
    ]
    return pl.concat(frames)


async def _load_all(specs: list[LoadSpec], servers: list[VllmServer]) -> list[LoadResult]:
    return list(await asyncio.gather(*(_guarded_load(s, srv.alive) for s, srv in zip(specs, servers, strict=True))))


def run_replication(job: SweepJob, replicas: int, one_gpu_max: int, out: Path) -> dict[str, Any]:
    """Run ``replicas`` servers of ``job.model`` on one GPU; write ``out`` (requests of all replicas,
    column ``replica``) and the telemetry beside it (:func:`slmserve.analysis.telemetry_path`)."""
    install_signal_handlers()
    batch = one_gpu_max // replicas
    tel_path = analysis.telemetry_path(out)
    prompts = load_prompts(job)
    with GpuSlots(1, label=f"{job.model} x{replicas}") as alloc:
        base = {"run": {**job.describe(), "replicas": replicas, "batch_per_replica": batch,
                        "one_gpu_max_batch": one_gpu_max, "batch_sizes": None},
                "provenance": provenance.collect({**job.describe(), "replicas": replicas}, alloc.nvml_indices),
                "gpu_ids": list(alloc.ids)}  # fmt: skip
        if batch < 1:
            return _infeasible(base, out, tel_path, f"one-GPU maximum batch {one_gpu_max} < {replicas} replicas")
        share = dataclasses.replace(
            job,
            memory_share=job.memory_share / replicas,
            memory_budget_gb=job.memory_budget_gb / replicas if job.memory_budget_gb else None,
            cpu_kv_cache_gb=job.cpu_kv_cache_gb / replicas,
        )
        with contextlib.ExitStack() as stack:
            servers = []
            try:
                for i in range(replicas):
                    spec = _server_spec(share, alloc, batch, f"r{replicas}-{i}")
                    servers.append(stack.enter_context(VllmServer(spec)))
            except InfeasibleError as exc:
                return _infeasible(base, out, tel_path, f"replica {len(servers)}: {exc.reason}")
            for i, srv in enumerate(servers):
                need = batch * capacity.blocks_rounded(job.input_len, srv.block_size)
                if srv.kv_cache_tokens is not None and need > srv.kv_cache_tokens:
                    return _infeasible(base, out, tel_path, f"replica {i}: batch {batch} needs {need} KV-cache "
                                       f"tokens for its prompts, it has {srv.kv_cache_tokens}")  # fmt: skip
            parts = split_evenly(prompts.height, replicas)
            specs = [
                LoadSpec(
                    base_url=srv.base_url, model=job.model,
                    prompts=prompts["token_ids"][p.start:p.stop].to_list(),
                    request_ids=prompts["request_id"][p.start:p.stop].to_list(),
                    output_len=job.output_len, seed=job.seed, stream=job.stream, replica=i,
                    warmup=warmup_for(job.warmup_requests, batch, len(p)),
                    lag_threshold_s=max(0.010, 0.0005 * len(p)),
                )
                for i, (srv, p) in enumerate(zip(servers, parts, strict=True))
            ]  # fmt: skip
            before = [srv.counters() for srv in servers]
            sampler = telemetry.Sampler(alloc.nvml_indices, job.telemetry_interval_s)
            if job.telemetry_enabled:
                sampler.start()
            try:
                results = asyncio.run(_load_all(specs, servers))
            except ServerError:  # a replica's server died: name it, with its log tail
                dead = next((i for i, srv in enumerate(servers) if not srv.alive()), 0)
                raise server_died(servers[dead], f"of replica {dead}") from None
            finally:
                tel = sampler.stop() if job.telemetry_enabled else telemetry.empty_frame()
            for i, (srv, res) in enumerate(zip(servers, results, strict=True)):
                check_load(srv, res, f"of replica {i}")
            after = [srv.counters() for srv in servers]
            meta = {
                **base, "status": "ok", "reason": None,
                "t0_mono": min(r.t0_mono for r in results),
                "servers": [srv.info() for srv in servers],
                "loads": [result_meta(r) for r in results],
                "server_counters": [{k: a[k] - b.get(k, 0.0) for k in a if k in COUNTERS}
                                    for a, b in zip(after, before, strict=True)],
                "telemetry": {"enabled": job.telemetry_enabled, **sampler.status},
            }  # fmt: skip
            io.write_parquet(tel, tel_path, meta)
            io.write_parquet(merge_replicas(results), out, meta)
            log.info("%s x%d: %s requests done", job.model, replicas, [r.n_ok for r in results])
            return meta


def _infeasible(base: dict, out: Path, tel_path: Path, reason: str) -> dict[str, Any]:
    meta = {**base, "status": "infeasible", "reason": reason}
    log.warning("infeasible: %s", reason)
    io.write_parquet(telemetry.empty_frame(), tel_path, meta)
    io.write_parquet(to_frame_empty(), out, meta)
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
