"""The load generator: drives a vLLM OpenAI-compatible server (``POST {base_url}/v1/completions``).

The server runs with ``--skip-tokenizer-init``, so every prompt is a list of token ids and the
response text is empty; tokens are counted from the server's ``usage`` (the final chunk of a stream,
requested with ``stream_options.include_usage``, or the ``usage`` of a non-streaming response).

Timing model (all times are ``time.monotonic()`` seconds relative to ``t0``, the start of the
measured phase; :class:`LoadResult` keeps ``t0_mono`` and ``t0_wall`` so absolute times can be
rebuilt and joined with telemetry sampled on ``time.monotonic()``):

* ``scheduled_s``: the request's arrival, from :func:`schedule` (pre-computed before ``t0``).
* ``sent_s``: the moment the client issued the HTTP request. With a concurrency limit a request
  may wait for a free slot first; that wait counts as latency, exactly as if the server had queued
  it, because latency and TTFT are measured from ``scheduled_s``.
* ``first_token_s``: arrival of the first chunk with non-empty ``choices`` (streaming only).
* ``end_s``: the response was read to its end (or the request failed).

Client lag, ``sent - allowed`` with ``allowed = max(scheduled, time the slot was freed)``, measures
how late the client itself was; ``lag_ok`` says its p99 stayed under ``lag_threshold_s``.
``peak_inflight`` is the most requests in flight between send and end; for all-at-once arrivals
``inflight_ok`` says the client really had the whole batch (or ``concurrency`` of it) in flight.

A failed request (non-200, connection error, timeout, a stream cut short or without usage) is a
record with ``status="error"``, never an exception and never dropped. If a connection is refused
(the server died or never listened), the run aborts: requests not yet sent become errors at once
instead of waiting for their scheduled arrival, so the run ends promptly.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import polars as pl

__all__ = [
    "FRAME_SCHEMA",
    "LoadResult",
    "LoadSpec",
    "RequestRecord",
    "SseSplitter",
    "result_meta",
    "run_load",
    "run_load_async",
    "schedule",
    "to_frame",
]

_ERROR_EXCERPT = 500
_HEADERS = {"Content-Type": "application/json"}


@dataclass
class LoadSpec:
    """One load-generation run against one server (one replica)."""

    base_url: str
    """Server root, e.g. ``http://127.0.0.1:8000`` (``/v1/completions`` is appended)."""
    model: str
    """Served model name (``--served-model-name``)."""
    prompts: list[list[int]]
    """Prompt token ids, one list per request."""
    request_ids: list[int]
    """Request ids, same length as ``prompts``; they label the records."""
    output_len: int
    """``max_tokens`` of every request (with ``ignore_eos`` the server generates exactly this many)."""
    rate: float = math.inf
    """Mean arrival rate in requests/s (Poisson); ``math.inf`` sends all requests at once."""
    concurrency: int | None = None
    """Client-side limit on requests in flight; ``None`` = unlimited."""
    seed: int = 0
    """Seed of the Poisson schedule."""
    warmup: int = 0
    """Warm-up requests sent before the measured phase (prompts taken cyclically from the first
    ones, same concurrency limit, all at once) and left out of the results."""
    stream: bool = True
    timeout_s: float = 3600.0
    """Total time limit of one request (from send to end of response)."""
    stall_timeout_s: float | None = 300.0
    """Longest silence allowed between a streamed response's chunks once its first token has arrived
    (catches a hung server; a dead one resets its connections at once). A stall ends the request after
    between half and all of it: the limit is re-armed when half of it has passed. The wait for the first token is
    not limited by it, only by ``timeout_s``: a request the server keeps queued gets nothing until it
    is scheduled (at b=1 the 500th request waits for 499 others: 311 s for OPT-350M on an H100).
    Not applied with ``stream=False``. ``None``: no limit."""
    connect_timeout_s: float = 30.0
    keepalive_s: float = 4.0
    """Idle keep-alive connections older than this are not reused: below uvicorn's (vLLM's) 5 s
    keep-alive, so the client never sends on a connection the server is closing."""
    replica: int = 0
    """Label copied into every record (which server replica was driven)."""
    lag_threshold_s: float = 0.010
    """``lag_ok`` is true when the p99 client lag is below this."""
    abort_on_connect_error: bool = True
    """On a refused connection, fail the requests not yet sent at once instead of sending them."""
    vllm_xargs: dict[str, Any] | None = None
    """Sent as the body's ``vllm_xargs``: vLLM hands it to the engine as ``sampling_params.extra_args``."""


@dataclass(slots=True)
class RequestRecord:
    """One measured request; times are monotonic seconds relative to ``t0`` (``None``: never happened)."""

    request_id: int
    replica: int
    scheduled_s: float
    sent_s: float | None = None
    first_token_s: float | None = None
    end_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    n_chunks: int | None = None
    """Token-bearing chunks (non-empty ``choices``); ``None`` in non-streaming mode."""
    itl_max_s: float | None = None
    """Largest gap between consecutive token-bearing chunks; ``None`` with fewer than two."""
    status: str = "error"
    error: str | None = None


@dataclass
class LoadResult:
    records: list[RequestRecord]
    t0_mono: float
    """``time.monotonic()`` at the start of the measured phase."""
    t0_wall: float
    """``time.time()`` taken at the same moment as ``t0_mono``."""
    peak_inflight: int
    lag_p50_s: float | None
    lag_p99_s: float | None
    lag_max_s: float | None
    lag_ok: bool
    inflight_ok: bool
    n_ok: int
    n_error: int
    duration_s: float | None
    """First send to last end of the measured requests; ``None`` if none was sent."""
    warmup_done: int
    """Warm-up requests that completed successfully."""
    n_requests: int = 0
    aborted: bool = False
    """The run aborted on a refused connection (requests not yet sent became errors)."""
    lag_threshold_s: float = 0.010
    client_cpu_s: float | None = None
    """CPU time of this process (all threads) during the measured phase."""

    @property
    def client_cpu_frac(self) -> float | None:
        """``client_cpu_s`` per second of the run: near 1.0 means one core was saturated."""
        if self.client_cpu_s is None or not self.duration_s:
            return None
        return self.client_cpu_s / self.duration_s


def schedule(n: int, rate: float, seed: int) -> list[float]:
    """Arrival offsets in seconds from ``t0`` for ``n`` requests.

    ``rate == math.inf``: all zeros (everything at once). Otherwise a Poisson process: gaps are
    ``random.Random(seed).expovariate(rate)`` and the first request arrives at 0 (no random idle
    time before the first arrival), so ``offsets[i]`` is the sum of the first ``i`` gaps. The result
    is sorted, starts at 0, and a shorter schedule is a prefix of a longer one with the same seed.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if math.isinf(rate) and rate > 0:
        return [0.0] * n
    if not rate > 0 or math.isnan(rate):
        raise ValueError(f"rate must be > 0 (or math.inf), got {rate}")
    rng = random.Random(seed)
    out: list[float] = []
    t = 0.0
    for i in range(n):
        if i:
            t += rng.expovariate(rate)
        out.append(t)
    return out


class _Slots:
    """A FIFO concurrency limit that tells a waiter when its slot was freed."""

    def __init__(self, n: int) -> None:
        self._free = n
        self._waiters: deque[asyncio.Future[float]] = deque()

    async def acquire(self) -> float | None:
        """``None`` if a slot was free at once, else the monotonic time the slot was handed over."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return None
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())
            raise

    def release(self, t: float) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(t)
                return
        self._free += 1


def _percentile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in [0, 1]) of a non-empty sorted list."""
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def _describe(exc: BaseException) -> str:
    text = str(exc) or repr(exc)
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        text = f"timed out ({text})"
    return f"{type(exc).__name__}: {text}"[:_ERROR_EXCERPT]


def request_body(
    model: str, prompt: Sequence[int], output_len: int, stream: bool, *, vllm_xargs: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The completion request every client of the project sends: token-id prompt, exactly ``output_len``
    tokens (``ignore_eos``), greedy; ``vllm_xargs``, when given, goes to the engine as
    ``sampling_params.extra_args``."""
    req: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": output_len,
        "ignore_eos": True,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        req["stream_options"] = {"include_usage": True}
    if vllm_xargs is not None:
        req["vllm_xargs"] = dict(vllm_xargs)
    return req


def _body(spec: LoadSpec, prompt: list[int]) -> bytes:
    body = request_body(spec.model, prompt, spec.output_len, spec.stream, vllm_xargs=spec.vllm_xargs)
    return json.dumps(body, separators=(",", ":")).encode()


class _Phase:
    """One batch of requests (warm-up or measured) sharing a session, a schedule and a slot limit."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        spec: LoadSpec,
        bodies: list[bytes],
        ids: list[int],
        offsets: list[float],
    ) -> None:
        self.session = session
        self.spec = spec
        self.url = spec.base_url.rstrip("/") + "/v1/completions"
        self.bodies = bodies
        self.ids = ids
        self.offsets = offsets
        self.slots = _Slots(spec.concurrency) if spec.concurrency else None
        self.records: list[RequestRecord | None] = [None] * len(bodies)
        self.lags: list[float] = []
        self.inflight = 0
        self.peak_inflight = 0
        self.aborted = False
        self.abort_reason = ""
        self._wake: asyncio.Future[None] | None = None
        self.t0 = 0.0
        self.t0_wall = 0.0

    def _abort(self, reason: str) -> None:
        if self.aborted or not self.spec.abort_on_connect_error:
            return
        self.aborted = True
        self.abort_reason = reason
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def run(self) -> float:
        """Send every request on schedule; returns ``t0`` (monotonic)."""
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[None]] = []
        self.t0 = t0 = time.monotonic()
        self.t0_wall = time.time()
        n_dispatched = 0
        for i, off in enumerate(self.offsets):
            if self.aborted:
                break
            deadline = t0 + off
            if deadline > time.monotonic():
                # loop.time() is time.monotonic() in asyncio's event loops: wait until the deadline,
                # or less if the run aborts meanwhile.
                self._wake = loop.create_future()
                handle = loop.call_at(deadline, _set_if_pending, self._wake)
                try:
                    await self._wake
                finally:
                    handle.cancel()
                    self._wake = None
                if self.aborted:
                    break
            tasks.append(asyncio.create_task(self._one(i)))
            n_dispatched += 1
        if tasks:
            await asyncio.gather(*tasks)
        now = time.monotonic()
        for i in range(n_dispatched, len(self.offsets)):
            self.records[i] = RequestRecord(
                request_id=self.ids[i],
                replica=self.spec.replica,
                scheduled_s=self.offsets[i],
                end_s=max(now - t0, self.offsets[i]),
                status="error",
                error=f"not sent: run aborted after {self.abort_reason}"[:_ERROR_EXCERPT],
            )
        return t0

    async def _one(self, i: int) -> None:
        spec = self.spec
        t0 = self.t0
        sched_abs = t0 + self.offsets[i]
        rec = RequestRecord(request_id=self.ids[i], replica=spec.replica, scheduled_s=self.offsets[i])
        self.records[i] = rec
        allowed = sched_abs
        if self.slots is not None:
            freed_at = await self.slots.acquire()
            if freed_at is not None:
                allowed = max(sched_abs, freed_at)
        try:
            if self.aborted:
                rec.end_s = time.monotonic() - t0
                rec.error = f"not sent: run aborted after {self.abort_reason}"[:_ERROR_EXCERPT]
                return
            sent = time.monotonic()
            self.lags.append(sent - allowed)
            rec.sent_s = sent - t0
            self.inflight += 1
            if self.inflight > self.peak_inflight:
                self.peak_inflight = self.inflight
            try:
                await self._send(i, rec)
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
                rec.status = "error"
                rec.error = _describe(exc)
                if isinstance(exc, aiohttp.ClientConnectorError):
                    self._abort(rec.error)
            finally:
                self.inflight -= 1
                if rec.end_s is None:
                    rec.end_s = time.monotonic() - t0
        finally:
            if self.slots is not None:
                self.slots.release(time.monotonic())

    async def _send(self, i: int, rec: RequestRecord) -> None:
        t0 = self.t0
        async with self.session.post(self.url, data=self.bodies[i], headers=_HEADERS) as resp:
            if resp.status != 200:
                text = (await resp.read()).decode("utf-8", "replace")
                rec.end_s = time.monotonic() - t0
                rec.error = f"HTTP {resp.status}: {text}"[:_ERROR_EXCERPT]
                return
            if not self.spec.stream:
                obj = json.loads(await resp.read())
                rec.end_s = time.monotonic() - t0
                _finish(rec, obj.get("usage"), obj, done=True)
                return
            await self._read_stream(resp, rec)

    async def _read_stream(self, resp: aiohttp.ClientResponse, rec: RequestRecord) -> None:
        """Read the SSE stream into ``rec``; on an exception what was received so far stays in ``rec``."""
        sse = SseSplitter()
        clock = _TokenClock(rec, self.t0)
        usage: Any = None
        stream_error: Any = None
        limit = self.spec.stall_timeout_s
        deadline = -math.inf  # time.monotonic() is the event loop's clock
        stall = asyncio.timeout(None)  # armed at the first token: a queued request's wait is not a stall
        try:
            async with stall:
                async for data in resp.content.iter_any():
                    now = time.monotonic()
                    for payload in sse.feed(data):
                        token, chunk_usage, chunk_error = _read_chunk(payload)
                        usage = chunk_usage or usage
                        stream_error = stream_error if chunk_error is None else chunk_error
                        if token:
                            clock.token(now)
                    # re-armed once half the limit has passed, not on every chunk (a timer each: 5 us)
                    if limit is not None and rec.first_token_s is not None and now + limit / 2 > deadline:
                        deadline = now + limit
                        stall.reschedule(deadline)
            if sse.rest.strip():
                stream_error = f"incomplete last line {sse.rest[:100]!r}"
        except TimeoutError:
            if not stall.expired():  # the request's total limit, not the stall limit
                raise
            raise TimeoutError(f"stream stalled: no data for {limit:g} s after a token") from None
        finally:
            clock.close()
        rec.end_s = time.monotonic() - self.t0
        if stream_error is not None:
            text = stream_error if isinstance(stream_error, str) else json.dumps(stream_error)
            rec.error = f"error in stream: {text}"[:_ERROR_EXCERPT]
        _finish(rec, usage, None, done=sse.done)


class SseSplitter:
    """Bytes of a server-sent-event stream, as they arrive, to the payloads of its complete ``data:`` lines.

    Other lines (blank separators, comments, other fields) are skipped; ``data: [DONE]`` sets :attr:`done`
    instead of being returned. An incomplete last line waits for the next :meth:`feed`; what is left when
    the stream ends is :attr:`rest`.
    """

    def __init__(self) -> None:
        self.rest = b""
        self.done = False

    def feed(self, data: bytes) -> list[bytes]:
        """The stripped payloads of the ``data:`` lines that ``data`` completes."""
        lines = (self.rest + data).split(b"\n") if self.rest else data.split(b"\n")
        self.rest = lines.pop()
        out = []
        for raw in lines:
            if not raw.startswith(b"data:"):
                continue
            payload = raw[5:].strip()
            if payload == b"[DONE]":
                self.done = True
            else:
                out.append(payload)
        return out


def _read_chunk(payload: bytes) -> tuple[bool, Any, Any]:
    """One streamed completion chunk: whether it carries tokens, its ``usage`` and its error (or None)."""
    # vLLM's compact JSON: outside a string '"choices":[{' can only open a non-empty choices list (a quote
    # inside a string is escaped), so a chunk with it and no usage object needs no decoding.
    if b'"choices":[{' in payload and b'"usage":{' not in payload:
        return True, None, None
    obj = json.loads(payload)
    error = None
    if obj.get("error") is not None or obj.get("object") == "error":
        error = obj.get("error") or obj.get("message") or obj
    return bool(obj.get("choices")), obj.get("usage"), error


class _TokenClock:
    """Times of a stream's token-bearing chunks, written into ``rec`` (the first at once, the rest on close)."""

    def __init__(self, rec: RequestRecord, t0: float) -> None:
        self._rec = rec
        self._t0 = t0
        self._last: float | None = None
        self._itl_max = 0.0
        self._n = 0

    def token(self, now: float) -> None:
        """A token-bearing chunk arrived at ``now`` (monotonic seconds)."""
        self._n += 1
        if self._last is None:
            self._rec.first_token_s = now - self._t0
        elif now - self._last > self._itl_max:
            self._itl_max = now - self._last
        self._last = now

    def close(self) -> None:
        """Write ``n_chunks`` and ``itl_max_s`` into the record."""
        self._rec.n_chunks = self._n
        self._rec.itl_max_s = self._itl_max if self._n >= 2 else None


def _set_if_pending(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _finish(rec: RequestRecord, usage: Any, obj: Any, *, done: bool) -> None:
    """Set token counts from ``usage`` and decide the status."""
    if isinstance(usage, dict):
        pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
        rec.prompt_tokens = pt if isinstance(pt, int) else None
        rec.completion_tokens = ct if isinstance(ct, int) else None
    if rec.error is not None:
        rec.status = "error"
    elif rec.completion_tokens is None:
        rec.status = "error"
        where = "stream" if obj is None else "response"
        rec.error = f"{where} without usage.completion_tokens"
    elif not done:
        rec.status = "error"
        rec.error = "stream ended without [DONE]"
    else:
        rec.status = "ok"


def _validate(spec: LoadSpec) -> None:
    if len(spec.prompts) != len(spec.request_ids):
        raise ValueError(f"{len(spec.prompts)} prompts but {len(spec.request_ids)} request ids")
    if spec.concurrency is not None and spec.concurrency < 1:
        raise ValueError(f"concurrency must be >= 1 or None, got {spec.concurrency}")
    if spec.output_len < 1:
        raise ValueError(f"output_len must be >= 1, got {spec.output_len}")
    if spec.warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {spec.warmup}")
    if spec.warmup and not spec.prompts:
        raise ValueError("warm-up needs at least one prompt")


async def run_load_async(spec: LoadSpec, on_measure: Callable[[], object] | None = None) -> LoadResult:
    """Run the warm-up, then the measured requests of ``spec``; never raises for a failed request.
    ``on_measure`` (e.g. reading the server's counters) runs in a thread between the two, after the last
    warm-up request has ended and before the first measured one is sent."""
    _validate(spec)
    n = len(spec.prompts)
    offsets = schedule(n, spec.rate, spec.seed)
    bodies = [_body(spec, p) for p in spec.prompts]
    warm_bodies = [bodies[j % n] for j in range(spec.warmup)] if spec.warmup else []
    timeout = aiohttp.ClientTimeout(
        total=spec.timeout_s,
        sock_connect=spec.connect_timeout_s,
    )
    # limit=0: no connector-side cap, so only ``concurrency`` limits what is in flight; keep-alive on.
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=spec.keepalive_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        warmup_done = 0
        if warm_bodies:
            warm_ids = [-1 - j for j in range(spec.warmup)]
            warm = _Phase(session, spec, warm_bodies, warm_ids, [0.0] * spec.warmup)
            await warm.run()
            warmup_done = sum(1 for r in warm.records if r is not None and r.status == "ok")
        if on_measure is not None:
            await asyncio.to_thread(on_measure)
        phase = _Phase(session, spec, bodies, list(spec.request_ids), offsets)
        cpu0 = time.process_time()
        t0 = await phase.run()
        client_cpu_s = time.process_time() - cpu0
        t0_wall = phase.t0_wall
    records = [r for r in phase.records if r is not None]
    lags = sorted(phase.lags)
    n_ok = sum(1 for r in records if r.status == "ok")
    sent = [r.sent_s for r in records if r.sent_s is not None]
    ends = [r.end_s for r in records if r.sent_s is not None and r.end_s is not None]
    duration = (max(ends) - min(sent)) if sent and ends else None
    if math.isinf(spec.rate):
        want = min(spec.concurrency or n, n)
        inflight_ok = phase.peak_inflight >= want
    else:
        inflight_ok = True
    lag_p99 = _percentile(lags, 0.99) if lags else None
    return LoadResult(
        records=records,
        t0_mono=t0,
        t0_wall=t0_wall,
        peak_inflight=phase.peak_inflight,
        lag_p50_s=_percentile(lags, 0.5) if lags else None,
        lag_p99_s=lag_p99,
        lag_max_s=lags[-1] if lags else None,
        lag_ok=lag_p99 is None or lag_p99 < spec.lag_threshold_s,
        inflight_ok=inflight_ok,
        n_ok=n_ok,
        n_error=len(records) - n_ok,
        duration_s=duration,
        warmup_done=warmup_done,
        n_requests=n,
        aborted=phase.aborted,
        lag_threshold_s=spec.lag_threshold_s,
        client_cpu_s=client_cpu_s,
    )


def run_load(spec: LoadSpec, on_measure: Callable[[], object] | None = None) -> LoadResult:
    """Synchronous wrapper of :func:`run_load_async` (runs its own event loop)."""
    return asyncio.run(run_load_async(spec, on_measure))


FRAME_SCHEMA: dict[str, pl.DataType] = {
    "request_id": pl.Int64(),
    "replica": pl.Int32(),
    "scheduled_s": pl.Float64(),
    "sent_s": pl.Float64(),
    "first_token_s": pl.Float64(),
    "end_s": pl.Float64(),
    "latency_s": pl.Float64(),
    "ttft_s": pl.Float64(),
    "tpot_s": pl.Float64(),
    "prompt_tokens": pl.Int64(),
    "completion_tokens": pl.Int64(),
    "n_chunks": pl.Int64(),
    "itl_max_s": pl.Float64(),
    "status": pl.String(),
    "error": pl.String(),
}


def to_frame(result: LoadResult) -> pl.DataFrame:
    """One row per measured request, columns as in :data:`FRAME_SCHEMA`.

    ``latency_s = end - scheduled``; ``ttft_s = first_token - scheduled``;
    ``tpot_s = (end - first_token) / (completion_tokens - 1)``, null if there is no first token or
    ``completion_tokens <= 1``.
    """
    cols: dict[str, list[Any]] = {k: [] for k in FRAME_SCHEMA}
    for r in result.records:
        lat = None if r.end_s is None else r.end_s - r.scheduled_s
        ttft = None if r.first_token_s is None else r.first_token_s - r.scheduled_s
        tpot = None
        if r.first_token_s is not None and r.end_s is not None and (r.completion_tokens or 0) > 1:
            assert r.completion_tokens is not None
            tpot = (r.end_s - r.first_token_s) / (r.completion_tokens - 1)
        row = {
            "request_id": r.request_id,
            "replica": r.replica,
            "scheduled_s": r.scheduled_s,
            "sent_s": r.sent_s,
            "first_token_s": r.first_token_s,
            "end_s": r.end_s,
            "latency_s": lat,
            "ttft_s": ttft,
            "tpot_s": tpot,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
            "n_chunks": r.n_chunks,
            "itl_max_s": r.itl_max_s,
            "status": r.status,
            "error": r.error,
        }
        for k, v in row.items():
            cols[k].append(v)
    return pl.DataFrame(cols, schema=FRAME_SCHEMA)


def result_meta(result: LoadResult) -> dict[str, Any]:
    """The scalar fields of ``result`` (JSON-serialisable), for a result file's metadata."""
    return {
        "t0_mono": result.t0_mono,
        "t0_wall": result.t0_wall,
        "peak_inflight": result.peak_inflight,
        "lag_p50_s": result.lag_p50_s,
        "lag_p99_s": result.lag_p99_s,
        "lag_max_s": result.lag_max_s,
        "lag_threshold_s": result.lag_threshold_s,
        "lag_ok": result.lag_ok,
        "inflight_ok": result.inflight_ok,
        "n_requests": result.n_requests,
        "n_ok": result.n_ok,
        "n_error": result.n_error,
        "duration_s": result.duration_s,
        "warmup_done": result.warmup_done,
        "aborted": result.aborted,
        "client_cpu_s": result.client_cpu_s,
        "client_cpu_frac": result.client_cpu_frac,
    }
