"""Model replication on one GPU (paper, section 4.2; Figures 5-7).

``n`` vLLM servers of the same model share one GPU: each gets ``memory_share / n`` of its memory, a batch
of ``one-GPU maximum // n`` (``--max-num-seqs``) and an even part of the requests, all sent at once to
all replicas. The servers start one after another (``sequential``: vLLM sizes its KV cache from the free
memory), or ``together`` with explicit KV-cache bytes (:func:`replica_kv_bytes`); optionally under NVIDIA
MPS (:mod:`slmserve.mps`). Then the replicas are loaded together, ``repeats`` times.

Beyond the paper, a plan of its own: the batching advisor's (:func:`advisor_plan`, from ``advisor.csv`` of
:mod:`slmserve.advisor`), run beside the paper's equal split (``plan`` in results and summaries: ``equal`` or
``advisor``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from slmserve import analysis, capacity, layout, mps, nvml, provenance, telemetry
from slmserve.gpuslots import Allocation
from slmserve.jobguard import guard
from slmserve.measure import Measurement, batch_fits, header, measure, write_point, write_unmeasured
from slmserve.runner import SweepJob, job_gpus, load_prompts, load_spec, server_spec, wants_repeat
from slmserve.server import InfeasibleError, ServerSpec, VllmServer

log = logging.getLogger(__name__)

START_MODES = ("sequential", "together")
PLANS = ("equal", "advisor", "given")  # the paper's split, the batching advisor's, a batch given by hand


def split_evenly(n: int, parts: int) -> list[range]:
    """``range(n)`` cut into ``parts`` contiguous pieces whose sizes differ by at most one."""
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def replica_kv_bytes(probe: Mapping[str, Any], share: float, total_bytes: float, kv_bytes_per_token: int) -> int:
    """KV-cache bytes for a replica started with ``--kv-cache-memory-bytes``: what vLLM's own profiling gives a
    server of memory share ``s`` started alone, ``s·T − (u·T − K·b)``, with ``T`` the GPU's memory, ``u`` and
    ``K`` the whole-GPU probe's memory share and KV-cache tokens, and ``b`` the KV bytes per token: the bracket
    is what one server holds besides its KV cache (weights, activations, CUDA context and graphs), as the
    probe measured it. Raises :class:`InfeasibleError` if nothing is left for the KV cache."""
    used = float(probe["gpu_memory_utilization"]) * total_bytes - int(probe["kv_cache_tokens"]) * kv_bytes_per_token
    kv = int(share * total_bytes - used)
    if kv <= 0:
        raise InfeasibleError(f"a share of {share:.3f} x {total_bytes / 1e9:.1f} GB leaves no KV cache after the "
                              f"{used / 1e9:.2f} GB one server holds besides it (probe)")  # fmt: skip
    return kv


def replica_specs(share: SweepJob, alloc: Allocation, batch: int, replicas: int, probe: Mapping[str, Any] | None,
                  start: str, daemon: mps.Daemon | None) -> list[ServerSpec]:  # fmt: skip
    """The replicas' servers. Started ``together``, GPU servers get explicit KV-cache bytes
    (:func:`replica_kv_bytes`): vLLM would otherwise size each from the free memory the others are taking.
    Under MPS each gets the daemon's environment."""
    specs = [server_spec(share, alloc, batch, f"r{replicas}-{i}") for i in range(replicas)]
    if start == "together" and specs[0].kv_cache_memory_bytes is None:  # GPU; the CPU engine has explicit bytes
        if probe is None or not alloc.nvml_indices:
            raise ValueError("replicas started together on a GPU need the whole-GPU probe and NVML")
        total = nvml.total_memory_bytes(alloc.nvml_indices[0])
        per_token = capacity.kv_bytes_per_token(capacity.load_config(share.model_path))
        kv = replica_kv_bytes(probe, specs[0].gpu_memory_utilization or share.memory_share, total, per_token)
        specs = [dataclasses.replace(s, kv_cache_memory_bytes=kv) for s in specs]
    if daemon is not None:
        specs = [dataclasses.replace(s, env={**s.env, **daemon.env()}) for s in specs]
    return specs


def start_replicas(stack: contextlib.ExitStack, specs: list[ServerSpec], together: bool) -> list[VllmServer]:
    """Start the servers, each stopped when ``stack`` closes: one after another, or all launched at once
    and then waited for. An :class:`InfeasibleError` names the replica that vLLM refused."""
    servers = [VllmServer(spec) for spec in specs]
    steps = [(i, srv.launch if together else srv.start) for i, srv in enumerate(servers)]
    steps += [(i, srv.wait_ready) for i, srv in enumerate(servers) if together]
    for srv in servers:
        stack.callback(srv.stop)
    for i, step in steps:
        try:
            step()
        except InfeasibleError as exc:
            raise InfeasibleError(f"replica {i}: {exc.reason}") from exc
    return servers


@dataclasses.dataclass(frozen=True)
class AdvisorPlan:
    """The batching advisor's plan for one model: ``replicas`` servers of batch ``batch`` each, or none
    (``why`` says why)."""

    replicas: int | None
    batch: int | None
    why: str | None = None


def advisor_plan(table: pl.DataFrame, model: str, max_replicas: int, source: str = "advisor.csv") -> AdvisorPlan:
    """The advisor's plan for ``model`` from its table (``advisor.csv``, :func:`slmserve.advisor.advise`):
    ``replicas = max(1, min(replicas_fit, max_replicas))`` servers, each of ``chosen_batch`` and an equal share
    of the memory (``replicas_fit`` counts the servers of that batch the share holds without preemption). No
    plan where the advisor chose no batch (its ``note`` says why)."""
    missing = {"model", "chosen_batch", "replicas_fit"} - set(table.columns)
    if missing:
        raise ValueError(f"{source}: no column {', '.join(sorted(missing))}; rebuild it with the advisor rule")
    rows = table.filter(pl.col("model") == model)
    if rows.is_empty():
        return AdvisorPlan(None, None, f"{source} has no row for {model}: the advisor reads the sweep's models")
    row = rows.row(0, named=True)
    if row["chosen_batch"] is None:
        return AdvisorPlan(None, None, f"the advisor chose no batch for {model} ({row.get('note') or 'no reason'})")
    fit = int(row["replicas_fit"] or 1)
    return AdvisorPlan(max(1, min(fit, max_replicas)), int(row["chosen_batch"]))


def run_advisor_plan(job: SweepJob, plan: AdvisorPlan, one_gpu_max: int, out: Path, *,
                     probe: Mapping[str, Any] | None = None, start: str = "sequential", use_mps: bool = False,
                     advice: Mapping[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """:func:`run_replication` of the advisor's ``plan`` (``advice``: the advisor's row it came from, recorded
    with the run); a model without a plan is written as ``infeasible`` with the advisor's reason."""
    record = {"advisor": dict(advice) if advice is not None else None}
    if plan.replicas is None or plan.batch is None:
        # the job's GPU slot, though no server starts: the result names the GPU (and its model) it stands for
        with guard([out], f"{job.model} advisor plan"), job_gpus(job, "advisor plan", k=1) as alloc:
            run = _run_record(job, None, None, one_gpu_max, "advisor", start, use_mps, record)
            head = header(run, alloc.ids, alloc.nvml_indices)
            return write_unmeasured((out, layout.telemetry_path(out)), head, plan.why or "no plan")
    return run_replication(job, plan.replicas, one_gpu_max, out, probe=probe, start=start, use_mps=use_mps,
                           batch=plan.batch, plan="advisor", record=record)  # fmt: skip


def run_replication(job: SweepJob, replicas: int, one_gpu_max: int, out: Path, *,
                    probe: Mapping[str, Any] | None = None, start: str = "sequential",
                    use_mps: bool = False, batch: int | None = None, plan: str | None = None,
                    record: Mapping[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Run ``replicas`` servers of ``job.model`` on one GPU, started ``sequential`` or ``together``, under
    MPS if ``use_mps``; write ``out`` (requests of all replicas, column ``replica``) and the telemetry beside
    it (:func:`slmserve.analysis.telemetry_path`). ``probe`` is the whole-GPU KV-cache probe, which must be of
    this job's kind of GPU (:func:`slmserve.capacity.check_probe`). Each replica
    gets an equal share of the memory and the batch ``batch``, by default the one-GPU maximum split evenly
    (``one_gpu_max // replicas``, the paper's plan ``equal``); a plan of its own gives it and its name (``plan``:
    ``advisor``, or ``given`` by default), recorded with the run (and ``record``, e.g. the advisor's row)."""
    if start not in START_MODES:
        raise ValueError(f"replication start {start!r}: allowed values are {', '.join(START_MODES)}")
    plan = plan or ("equal" if batch is None else "given")
    if plan not in PLANS or (plan == "equal") != (batch is None):
        raise ValueError(
            f"replication plan {plan!r} with batch {batch}: allowed plans are {', '.join(PLANS)}; "
            "'equal' takes no batch (the one-GPU maximum / replicas), the others one"
        )
    if batch is not None and batch < 1:
        raise ValueError(f"replication batch {batch}: a replica's batch must be at least 1")
    batch = one_gpu_max // replicas if batch is None else batch
    paths = (out, layout.telemetry_path(out))
    with guard([out], f"{job.model} x{replicas}"):
        prompts = load_prompts(job)
        with job_gpus(job, f"x{replicas}", k=1) as alloc:
            # the batch (and with `together`, each replica's memory) came from the probe
            capacity.check_probe(probe, provenance.kind(alloc.nvml_indices))
            run = _run_record(job, replicas, batch, one_gpu_max, plan, start, use_mps, record)
            head = header(run, alloc.ids, alloc.nvml_indices)
            if batch < 1:
                return write_unmeasured(paths, head, f"one-GPU maximum batch {one_gpu_max} < {replicas} replicas")
            off = "experiments.replication.advisor_plan.variants without mps" if plan == "advisor" else None
            why = mps.unavailable(alloc.ids, off) if use_mps else None
            if why is not None:
                return write_unmeasured(paths, head, why, status="unsupported")
            share = dataclasses.replace(
                job,
                memory_share=job.memory_share / replicas,
                memory_budget_gb=job.memory_budget_gb / replicas if job.memory_budget_gb else None,
                cpu_kv_cache_gb=job.cpu_kv_cache_gb / replicas,
                batch_control="restart",
            )
            with contextlib.ExitStack() as stack:
                daemon = stack.enter_context(mps.Daemon(alloc.ids, job.log_dir / f"mps-{job.model}-r{replicas}")) \
                    if use_mps else None  # fmt: skip
                try:
                    specs = replica_specs(share, alloc, batch, replicas, probe, start, daemon)
                    servers = start_replicas(stack, specs, together=start == "together")
                except InfeasibleError as exc:
                    return write_unmeasured(paths, head, exc.reason)
                head["run"]["mps_servers"] = daemon.check_server() if daemon is not None else None
                return _measure_replicas(job, share, servers, batch, prompts, alloc, paths, head)


def _run_record(job: SweepJob, replicas: int | None, batch: int | None, one_gpu_max: int, plan: str, start: str,
                use_mps: bool, record: Mapping[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """The ``run`` of a replication result: the job's settings and how its replicas ran (``batch_rule``: how
    the batch was chosen, the paper's even split for plan ``equal``, else the plan's name)."""
    rule = "one-GPU maximum / replicas" if plan == "equal" else plan
    return {**job.describe(), "replicas": replicas, "batch_per_replica": batch, "one_gpu_max_batch": one_gpu_max,
            "batch_rule": rule, "plan": plan, "batch_sizes": None, "start": start, "mps": use_mps,
            **(record or {})}  # fmt: skip


def _measure_replicas(job: SweepJob, share: SweepJob, servers: list[VllmServer], batch: int, prompts: pl.DataFrame,
                      alloc: Allocation, paths: tuple[Path, Path], head: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Load the started replicas together, ``job.repeats`` times (within its budget), and write the point."""
    replicas = len(servers)
    for i, srv in enumerate(servers):
        reason = batch_fits(batch, srv, job.input_len, job.output_len, job.fits)
        if reason is not None:
            return write_unmeasured(paths, head, f"replica {i}: {reason}")
    log.info("%s x%d up: start-up %s s, KV cache %s tokens", job.model, replicas,
             [round(srv.startup_s or 0, 1) for srv in servers], [srv.kv_cache_tokens for srv in servers])  # fmt: skip
    parts = split_evenly(prompts.height, replicas)
    specs = [load_spec(share, srv, batch, prompts[p.start : p.stop], replica=i)
             for i, (srv, p) in enumerate(zip(servers, parts, strict=True))]  # fmt: skip
    runs: list[Measurement] = []
    while wants_repeat([m.wall_s for m in runs], job.repeats, job.repeat_budget_s):
        runs.append(measure(servers, specs, alloc.nvml_indices, interval_s=job.telemetry_interval_s,
                            sample=job.telemetry_enabled, where="", beside=alloc.beside))  # fmt: skip
    meta = write_point(paths, head, runs)
    log.info("%s x%d: %d repeats, %s requests done", job.model, replicas, len(runs),
             [ld["n_ok"] for ld in runs[-1].meta["loads"]])  # fmt: skip
    return meta


def _replication_row(meta: dict[str, Any], path: str, models: dict[str, Any] | None) -> dict[str, Any]:
    analysis.require(meta, path, ("run", "provenance"))
    analysis.require(meta, path, ("run.model", "run.replicas", "run.batch_per_replica", "run.input_len",
                                  "run.output_len"))  # fmt: skip
    run, prov = meta["run"], meta["provenance"]
    entry = (models or {}).get(run["model"], {})
    return {
        "model": run["model"], "family": entry.get("family"), "params": entry.get("params"),
        "replicas": run["replicas"], "batch_per_replica": run["batch_per_replica"],
        "start": run.get("start", "sequential"), "mps": bool(run.get("mps", False)),
        "memory_budget_gb": run.get("memory_budget_gb"),  # all replicas together; None: the GPU's share
        "plan": run.get("plan", "equal"),
        "input_len": run["input_len"], "output_len": run["output_len"],
        "status": meta["status"], "reason": meta.get("reason"),
        "gpu_model": analysis.gpu_model(prov), "gpu_ids": analysis.repeat_gpu_ids(meta),
        "engine": prov.get("engine"), "engine_version": prov.get("engine_version"), "path": path,
    }  # fmt: skip


def repeat_metrics(req: pl.DataFrame, rep: dict[str, Any], tel: pl.DataFrame) -> dict[str, Any]:
    """Metrics of one repeat of a replication run (request times on the replicas' common clock):

    * ``throughput_rps`` (system throughput, the headline) = all replicas' completed requests / (last end -
      first send over all replicas); ``output_tok_s`` likewise with output tokens;
    * ``throughput_sum_rps`` = the sum of each replica's own rate (its requests over its own window), the
      paper's way of adding replicas up; it exceeds the system throughput when replicas end at different times;
    * ``latency_mean_s`` = the largest replica mean (as in the paper), ``latency_mean_per_replica`` each one;
    * ``preemptions`` = vLLM's preemptions summed over the replicas, unknown (None) if a count is missing
      (``preemptions_measured_only``: :func:`slmserve.analysis.measured_only`);
    * ``effective_batch`` = the replicas' effective batches summed, unknown (None) if one is missing;
      ``gauge_samples`` = the fewest running-gauge samples of a replica;
    * telemetry over the common window; ``energy_per_token_j`` = GPU energy / all output tokens;
      ``host_steal_frac``: :func:`slmserve.telemetry.steal_frac` from the first replica's end of warm-up to
      the last replica's end (:func:`slmserve.measure.measure`); ``host_speed_repeat_ms``:
      :func:`slmserve.analysis.host_speed_of`.
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
        "preemptions": _preemptions(rep),
        "preemptions_measured_only": analysis.measured_only(rep),
        **_effective_batch(rep),
        "beside": analysis.beside_text(rep),
        "host_steal_frac": rep.get("host_steal_frac"),
        "host_speed_repeat_ms": analysis.host_speed_of(rep),
    }
    t0 = rep.get("t0_mono") or 0.0
    tsum = telemetry.summarize(tel, t0 + whole["window_start_s"], t0 + whole["window_end_s"])
    row.update(tsum)
    row.update(analysis.energy_metrics(tsum.get("energy_j"), whole.get("output_tokens"), whole["duration_s"],
                                       tsum["n_samples"]))  # fmt: skip
    return row


def _effective_batch(rep: dict[str, Any]) -> dict[str, float | None]:
    """``effective_batch``: the replicas' effective batches summed, and ``gauge_samples``: the fewest samples
    behind one; each None unless every replica has it (an unknown is not 0)."""
    engines = [e or {} for e in rep.get("engine") or []]
    batches = [e.get("effective_batch") for e in engines]
    counts = [e.get("gauge_samples") for e in engines]
    return {
        "effective_batch": math.fsum(batches) if batches and None not in batches else None,
        "gauge_samples": min(counts) if counts and None not in counts else None,
    }


def _preemptions(rep: dict[str, Any]) -> float | None:
    """vLLM's preemptions summed over the replicas; None unless every replica's counter was read (a failed
    /metrics read is an unknown count, not 0)."""
    counts = [(c or {}).get("vllm:num_preemptions_total") for c in rep.get("server_counters") or []]
    return math.fsum(counts) if counts and None not in counts else None


def summarize_repeats(path: str | Path, models: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One summary row per repeat of a replication run (:func:`repeat_metrics`)."""
    return analysis.repeat_rows(path, _replication_row, repeat_metrics, models)


def summarize_runs(paths: list[str | Path], models: dict[str, Any] | None = None) -> pl.DataFrame:
    """One row per replication run: its repeats' means with n and 95% CIs (:func:`slmserve.analysis.points`)."""
    rows = [r for p in paths for r in summarize_repeats(p, models)]
    if not rows:
        return pl.DataFrame()
    points = analysis.points(pl.DataFrame(rows, infer_schema_length=None))
    return analysis.complete(points.sort("model", "replicas", "plan", "mps", nulls_last=True))
