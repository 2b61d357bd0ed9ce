"""The measuring core: one load on one or more running servers, and the result file of a point.

:func:`measure` runs one load per server at once (a sweep point has one server, a replication run
several), with the telemetry sampler and vLLM's metrics beside it, and returns a :class:`Measurement`.
:func:`write_point` writes a point's repeats as one requests parquet (column ``repeat``) and one
telemetry parquet; :func:`write_unmeasured` writes a point that could not be measured (``infeasible``:
memory; ``unsupported``: the engine does not serve the model). Both carry the same metadata header
(:func:`header`): the run's settings, provenance and GPU ids.

Metadata of a measured point: ``status``, ``reason`` and ``repeats``, one entry per repeat with
``t0_mono`` (the earliest load's start), ``servers``, ``loads``, ``server_counters`` and ``engine``
(running-request statistics, :func:`slmserve.enginemetrics.effective_batch`), one item per server, and
``telemetry`` (the sampler's status), ``beside``: the other jobs that held GPUs of the host when the
repeat began or ended (absent where not asked, as in older files), ``host_steal_frac`` and
``host_speed_before_ms``/``host_speed_after_ms`` (from commit 094ee05 on; see :func:`measure`).
:func:`repeats_of` also reads the layout of older result files.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import polars as pl

from slmserve import capacity, enginemetrics, io, provenance, telemetry
from slmserve.loadgen import FRAME_SCHEMA, LoadResult, LoadSpec, result_meta, run_load_async, to_frame
from slmserve.server import ServerError, VllmServer, log_tail

_T = TypeVar("_T")
log = logging.getLogger(__name__)
# The columns of a point's result files: the load generator's and the telemetry sampler's, and the repeat.
REQUESTS_SCHEMA: dict[str, pl.DataType] = {**FRAME_SCHEMA, "repeat": pl.Int32()}
TELEMETRY_SCHEMA: dict[str, pl.DataType] = {**telemetry.SCHEMA, "repeat": pl.Int32()}
TIME_COLS = ("scheduled_s", "sent_s", "first_token_s", "end_s")
# How long a load that saw failed requests waits for its server to be reaped before it calls the failure
# the server's death (a killed server closes its sockets before it can be reaped).
DEATH_GRACE_S = 5.0
# Client lag allowed per request put in flight at t0 (starting one costs ~0.1-0.2 ms of client CPU).
LAG_MIN_S = 0.010
LAG_PER_REQUEST_S = 0.0005


def lag_threshold_s(at_once: int, rate: float = math.inf) -> float:
    """The client's p99 send-lag bound: 10 ms, plus 0.5 ms per request sent at t0 for all-at-once loads."""
    return LAG_MIN_S if math.isfinite(rate) else max(LAG_MIN_S, LAG_PER_REQUEST_S * at_once)


def kv_tokens_needed(batch: int, input_len: int, output_len: int, block_size: int | None, fits: str) -> int:
    """KV-cache tokens a batch needs, in whole blocks: its prompts (``fits="admission"``, vLLM's rule for
    admitting a request) or its whole requests, prompt and output (``"no_preemption"``)."""
    per_seq = input_len if fits == "admission" else input_len + output_len
    return batch * capacity.blocks_rounded(per_seq, block_size)


def batch_fits(batch: int, srv: VllmServer, input_len: int, output_len: int, fits: str) -> str | None:
    """None if ``batch`` fits the server's KV cache by the rule ``fits``; else the reason it does not."""
    need = kv_tokens_needed(batch, input_len, output_len, srv.block_size, fits)
    if srv.kv_cache_tokens is None or need <= srv.kv_cache_tokens:
        return None
    what = "prompts" if fits == "admission" else "whole requests"
    return f"batch {batch} needs {need} KV-cache tokens for its {what}, the server has {srv.kv_cache_tokens}"


# --- a server that dies during a load ----------------------------------------------------------------


async def until_server_dies(coro: Coroutine[Any, Any, _T], alive: Callable[[], bool], poll_s: float = 0.5) -> _T:
    """Await ``coro``, but cancel it and raise :class:`ServerError` as soon as ``alive()`` turns false."""
    task = asyncio.create_task(coro)
    while True:
        done, _ = await asyncio.wait({task}, timeout=poll_s)
        if done:
            return task.result()
        if not alive():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise ServerError("the vLLM server died during the measured run")


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
    first = next(r for r in result.records if r.status != "ok")
    raise ServerError(
        f"{result.n_error} of {len(result.records)} requests failed {where}; first error: {first.error}",
        srv.spec.log_path,
        log_tail(srv.spec.log_path),
    )


# --- one load -------------------------------------------------------------------------------------


@dataclass
class Measurement:
    """One repeat of a point: its requests (times relative to ``meta["t0_mono"]``), telemetry and metadata."""

    requests: pl.DataFrame
    telemetry: pl.DataFrame
    meta: dict[str, Any]
    wall_s: float  # warm-up included: what the repeat cost


async def _loads(
    servers: Sequence[VllmServer], specs: Sequence[LoadSpec], on_measure: Sequence[Callable[[], object]]
) -> list[LoadResult]:
    runs = (run_load_async(s, f) for s, f in zip(specs, on_measure, strict=True))
    return list(await asyncio.gather(*(until_server_dies(r, srv.alive) for r, srv in zip(runs, servers, strict=True))))


def _run_loads(
    servers: Sequence[VllmServer], specs: Sequence[LoadSpec], where: str, on_measure: Sequence[Callable[[], object]]
) -> list[LoadResult]:
    try:
        results = asyncio.run(_loads(servers, specs, on_measure))
    except ServerError:
        dead = next((i for i, srv in enumerate(servers) if not srv.alive()), 0)
        raise server_died(servers[dead], _where(where, dead, len(servers))) from None
    pairs = enumerate(zip(servers, results, strict=True))
    return [check_load(srv, r, _where(where, i, len(servers))) for i, (srv, r) in pairs]


def _where(where: str, i: int, n: int) -> str:
    return f"{where} of replica {i}" if n > 1 else where


def merge_loads(results: Sequence[LoadResult]) -> pl.DataFrame:
    """One requests frame for all loads of a repeat, times rebased to the earliest load's t0."""
    t0 = min(r.t0_mono for r in results)
    return pl.concat([to_frame(r).with_columns(pl.col(c) + (r.t0_mono - t0) for c in TIME_COLS) for r in results])


def measure(
    servers: Sequence[VllmServer],
    specs: Sequence[LoadSpec],
    gpu_ids: Sequence[int],
    *,
    interval_s: float,
    sample: bool,
    where: str,
    beside: Callable[[], list[dict[str, Any]]] | None = None,
) -> Measurement:
    """Run ``specs[i]`` against ``servers[i]``, all at once, with the telemetry sampler (when ``sample``)
    and a poller of each server's running-request gauge; raise :class:`ServerError` if a server dies or a
    request fails. ``beside`` (e.g. :meth:`slmserve.gpuslots.Allocation.neighbours`) lists the other jobs
    holding GPUs of the host; asked before and after the load, its jobs are recorded as ``beside``. The
    host's CPU steal over the measured phase (from the first load's end of warm-up to the last load's end) is
    recorded as ``host_steal_frac`` (:func:`slmserve.telemetry.steal_frac`), and the host's Python speed
    (:func:`slmserve.provenance.time_host_ms`, the result header's timing, so on its scale; 0.13-0.35 s a
    reading on the hosts measured, outside the measured phase) just before the loads and just after them,
    while no sampler or poller thread runs and the servers are idle, as ``host_speed_before_ms`` and
    ``host_speed_after_ms``."""
    t_start = time.monotonic()
    speed_before = provenance.time_host_ms()
    jobs_before = _ask(beside)
    before: list[dict[str, float]] = [{} for _ in servers]  # each read after its load's warm-up

    host_before: list[Any] = []  # the host's CPU times when the first load's measured phase begins

    def read_counters(i: int) -> None:
        if not host_before:
            host_before.append(telemetry.host_cpu_times())
        before[i] = servers[i].counters()

    sampler = telemetry.Sampler(gpu_ids, interval_s)
    pollers = [enginemetrics.GaugePoller(srv.base_url) for srv in servers]
    with contextlib.ExitStack() as stack:
        for p in pollers:
            stack.enter_context(p)
        if sample:
            sampler.start()
            stack.callback(sampler.stop)
        results = _run_loads(servers, specs, where, [functools.partial(read_counters, i) for i in range(len(servers))])
        host_after = telemetry.host_cpu_times()  # before the sampler's and pollers' threads are joined
    speed_after = provenance.time_host_ms()  # the threads above are joined
    tel = sampler.frame if sample and sampler.frame is not None else telemetry.empty_frame()
    after = [srv.counters() for srv in servers]
    meta = {
        "t0_mono": min(r.t0_mono for r in results),
        "servers": [srv.info() for srv in servers],
        "loads": [result_meta(r) for r in results],
        "server_counters": [enginemetrics.counter_delta(b, a) for b, a in zip(before, after, strict=True)],
        "counters_after_warmup": True,
        "engine": [
            enginemetrics.effective_batch(p.samples, *_window(r)) for p, r in zip(pollers, results, strict=True)
        ],
        "telemetry": {"enabled": sample, **sampler.status},
        "host_steal_frac": telemetry.steal_frac(host_before[0] if host_before else None, host_after),
        "host_speed_before_ms": speed_before,
        "host_speed_after_ms": speed_after,
    }
    jobs_after = _ask(beside)
    if jobs_before is not None and jobs_after is not None:
        meta["beside"] = _union(jobs_before, jobs_after)
    return Measurement(merge_loads(results), tel, meta, time.monotonic() - t_start)


def _ask(beside: Callable[[], list[dict[str, Any]]] | None) -> list[dict[str, Any]] | None:
    """``beside()``, or None where not asked or where it failed: a measured repeat is never lost to it."""
    if beside is None:
        return None
    try:
        return beside()
    except Exception as exc:  # the repeat then records no `beside` (unknown), never "alone"
        log.warning("could not tell which jobs ran beside this repeat: %s", exc)
        return None


def _union(*lists: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The jobs of several :func:`slmserve.gpuslots.neighbours` answers, each once (by pid and label)."""
    jobs = {(j.get("pid"), j.get("label")): dict(j) for js in lists for j in js}
    return [jobs[k] for k in sorted(jobs, key=lambda k: (str(k[1]), str(k[0])))]


def _window(r: LoadResult) -> tuple[float, float]:
    """A load's measurement window on the monotonic clock: first send to last end."""
    sent = [rec.sent_s for rec in r.records if rec.sent_s is not None]
    start = r.t0_mono + (min(sent) if sent else 0.0)
    return start, start + (r.duration_s or 0.0)


# --- result files -----------------------------------------------------------------------------------


def header(run: Mapping[str, Any], gpu_ids: Sequence[str], nvml_indices: Sequence[int]) -> dict[str, Any]:
    """What every result file of a point says first: the run's settings, provenance and GPU ids."""
    return {"run": dict(run), "provenance": provenance.collect(dict(run), nvml_indices), "gpu_ids": list(gpu_ids)}


def write_point(paths: tuple[Path, Path], head: Mapping[str, Any], repeats: Sequence[Measurement]) -> dict[str, Any]:
    """The requests and telemetry parquet of a measured point, every repeat in them (column ``repeat``)."""
    # wall_s: what each repeat cost, which decided whether the point got another (runner.wants_repeat)
    reps = [{"repeat": i, **m.meta, "wall_s": m.wall_s} for i, m in enumerate(repeats)]
    meta = {**head, "status": "ok", "reason": None, "repeats": reps}
    requests = pl.concat([m.requests.with_columns(repeat=pl.lit(i, pl.Int32)) for i, m in enumerate(repeats)])
    tel = pl.concat([m.telemetry.with_columns(repeat=pl.lit(i, pl.Int32)) for i, m in enumerate(repeats)])
    io.write_parquet(tel, paths[1], meta)
    io.write_parquet(requests, paths[0], meta)
    return meta


def write_unmeasured(paths: tuple[Path, Path], head: Mapping[str, Any], reason: str, status: str = "infeasible",
                     server: Mapping[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """A point that could not be measured, as a result: ``infeasible`` (memory) or ``unsupported`` (model)."""
    meta = {**head, "status": status, "reason": reason, "server": dict(server) if server else None}
    io.write_parquet(pl.DataFrame(schema=TELEMETRY_SCHEMA), paths[1], meta)
    io.write_parquet(pl.DataFrame(schema=REQUESTS_SCHEMA), paths[0], meta)
    return meta


def repeats_of(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The per-repeat metadata of a measured point (see the module docstring), also from older files: one
    repeat with ``load``/``server``/``server_counters`` of one server, or ``loads``/``servers`` of replicas."""
    if "repeats" in meta:
        return list(meta["repeats"])
    if meta.get("status") != "ok":
        return []
    keys = ("t0_mono", "servers", "loads", "server_counters", "telemetry")
    if "loads" in meta:
        return [{"repeat": 0, **{k: meta.get(k) for k in keys}}]
    load = meta.get("load") or {}
    return [{"repeat": 0, "t0_mono": load.get("t0_mono", 0.0), "servers": [meta.get("server")], "loads": [load],
             "server_counters": [meta.get("server_counters") or {}], "telemetry": meta.get("telemetry")}]  # fmt: skip
