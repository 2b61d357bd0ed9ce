"""Tests of the load generator against a STAND-IN completions server (no vLLM involved).

:class:`StandInCompletionsServer` is a small ``aiohttp.web`` app that imitates what vLLM's
``/v1/completions`` does for ``--skip-tokenizer-init`` token-id prompts: streamed SSE chunks with
empty text (one per output token, after a configurable per-token delay), then a usage chunk and
``data: [DONE]``; or a JSON response with usage when ``stream`` is false. It is a stand-in: its
timings and limits are whatever the test configures, not a model of a real engine.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import polars as pl
import pytest
from aiohttp import web

from slmserve import enginemetrics
from slmserve.enginemetrics import RUNNING
from slmserve.loadgen import (
    FRAME_SCHEMA,
    LoadSpec,
    SseSplitter,
    _body,
    request_body,
    result_meta,
    run_load,
    schedule,
    to_frame,
)

MODEL = "stand-in-model"


class StandInCompletionsServer:
    """A STAND-IN for vLLM's OpenAI-compatible ``POST /v1/completions`` (token-id prompts).

    Runs on 127.0.0.1 on a free port, in a background thread with its own event loop.

    * ``token_delay_s``: sleep before each output chunk (the non-streaming reply sleeps as long in all).
    * ``max_concurrency``: requests served at once by the stand-in (others queue), ``None`` = no limit.
    * ``fail_first_token``: a prompt starting with this token id gets HTTP 400.
    * ``drop_first_token``: a prompt starting with this token id has its connection dropped mid-stream.
    * ``stall_first_token``: a prompt starting with this token id gets headers, then nothing for
      ``stall_s`` seconds (a request queued by the server), then its tokens.
    * ``stall_mid_token``: a prompt starting with this token id gets headers and one token, then nothing
      for ``stall_s`` seconds (a hung server), then the rest.
    * ``compact``: compact JSON like vLLM's (``False``: ``json.dumps`` default spacing).

    It counts requests received (``n_requests``) and the most handled at once (``max_active``), and serves
    ``/metrics`` with the count and summed latency of the completions it answered, as vLLM's
    ``vllm:e2e_request_latency_seconds`` histogram, and those in hand as ``vllm:num_requests_running``.
    """

    def __init__(
        self,
        *,
        token_delay_s: float = 0.002,
        max_concurrency: int | None = None,
        fail_first_token: int | None = None,
        drop_first_token: int | None = None,
        stall_first_token: int | None = None,
        stall_mid_token: int | None = None,
        stall_s: float = 30.0,
        compact: bool = True,
    ) -> None:
        self.token_delay_s = token_delay_s
        self.max_concurrency = max_concurrency
        self.fail_first_token = fail_first_token
        self.drop_first_token = drop_first_token
        self.stall_first_token = stall_first_token
        self.stall_mid_token = stall_mid_token
        self.stall_s = stall_s
        self.separators = (",", ":") if compact else (", ", ": ")
        self.n_requests = 0
        self.active = 0
        self.max_active = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._sem: asyncio.Semaphore | None = None
        self.e2e_count, self.e2e_sum = 0, 0.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _dumps(self, obj: Any) -> bytes:
        return json.dumps(obj, separators=self.separators).encode()

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.n_requests += 1
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        t0 = time.perf_counter()
        try:
            if self._sem is not None:
                async with self._sem:
                    return await self._serve(request)
            return await self._serve(request)
        finally:
            self.active -= 1
            self.e2e_count, self.e2e_sum = self.e2e_count + 1, self.e2e_sum + time.perf_counter() - t0

    async def _metrics(self, request: web.Request) -> web.Response:
        name = "vllm:e2e_request_latency_seconds"
        text = (f"# TYPE {name} histogram\n{name}_count{{engine=\"0\"}} {self.e2e_count}\n"
                f"{name}_sum{{engine=\"0\"}} {self.e2e_sum}\n# TYPE {RUNNING} gauge\n"
                f"{RUNNING}{{engine=\"0\"}} {self.active}\n")  # fmt: skip
        return web.Response(text=text, content_type="text/plain")

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = body.get("prompt")
        if body.get("model") != MODEL:
            return web.json_response({"object": "error", "message": "model not found"}, status=404)
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            return web.json_response({"object": "error", "message": "bad prompt"}, status=400)
        if prompt[0] == self.fail_first_token:
            return web.json_response({"object": "error", "message": "stand-in refuses this"}, status=400)
        assert body["ignore_eos"] is True and body["temperature"] == 0
        n_out = int(body["max_tokens"])
        n_in = len(prompt)
        usage = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
        head = {"id": "cmpl-standin", "object": "text_completion", "created": 0, "model": MODEL}
        if not body.get("stream"):
            await asyncio.sleep(self.token_delay_s * n_out)
            choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
            return web.json_response({**head, "choices": [choice], "usage": usage})
        assert body["stream_options"] == {"include_usage": True}
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if prompt[0] == self.stall_first_token:
            await asyncio.sleep(self.stall_s)
        for k in range(n_out):
            await asyncio.sleep(self.token_delay_s)
            if prompt[0] == self.stall_mid_token and k == 1:
                await asyncio.sleep(self.stall_s)
            if prompt[0] == self.drop_first_token and k == n_out // 2:
                assert request.transport is not None
                request.transport.abort()
                return resp
            fin = "length" if k == n_out - 1 else None
            choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": fin, "stop_reason": None}
            await resp.write(b"data: " + self._dumps({**head, "choices": [choice], "usage": None}) + b"\n\n")
        await resp.write(b"data: " + self._dumps({**head, "choices": [], "usage": usage}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _start(self) -> None:
        self._sem = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def _serve_until_stopped(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        await self._start()
        self._started.set()
        await self._stop.wait()
        await self._kill()
        # asyncio.run then cancels whatever handler is left, so no task outlives the loop

    def _main(self) -> None:
        asyncio.run(self._serve_until_stopped())

    def start(self) -> StandInCompletionsServer:
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        assert self._started.wait(5)
        return self

    async def _kill(self) -> None:
        assert self._runner is not None and self._runner.server is not None
        for site in list(self._runner.sites):
            await site.stop()  # stop listening: new connections are refused
        for handler in list(self._runner.server.connections):
            if handler.transport is not None:
                handler.transport.abort()  # reset open connections, busy or idle (keep-alive)

    def kill(self) -> None:
        """Die like a crashed server: stop listening and reset every open connection."""
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._kill(), self._loop).result(5)

    def stop(self) -> None:
        if self._loop is None or self._thread is None or not self._thread.is_alive():
            return
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)


@pytest.fixture
def standin() -> Iterator[type[StandInCompletionsServer]]:
    """Factory of stand-in servers, all stopped at the end of the test."""
    made: list[StandInCompletionsServer] = []

    class _Factory(StandInCompletionsServer):
        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            made.append(self)
            self.start()

    yield _Factory
    for s in made:
        s.stop()


def _prompts(n: int, first: int = 1) -> list[list[int]]:
    # Prompt i has 3 + i % 5 tokens so prompt_tokens differ per request.
    return [[first + i, *range(2 + i % 5)] for i in range(n)]


def _spec(base_url: str, n: int, **kw: Any) -> LoadSpec:
    kw.setdefault("prompts", _prompts(n, first=1000))
    kw.setdefault("output_len", 8)
    return LoadSpec(base_url=base_url, model=MODEL, request_ids=list(range(100, 100 + n)), **kw)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- schedule ---------------------------------------------------------------------------------------


def test_schedule_inf_is_all_zeros() -> None:
    assert schedule(5, math.inf, 0) == [0.0] * 5
    assert schedule(0, 3.0, 0) == []


def test_schedule_poisson() -> None:
    a = schedule(2000, 100.0, seed=7)
    assert a == schedule(2000, 100.0, seed=7)
    assert a != schedule(2000, 100.0, seed=8)
    assert a[0] == 0.0 and all(x >= 0 for x in a)
    assert a == sorted(a)
    gaps = [b - x for x, b in itertools.pairwise(a)]
    assert abs(statistics.fmean(gaps) - 0.01) < 0.001
    assert schedule(10, 100.0, seed=7) == a[:10]
    with pytest.raises(ValueError):
        schedule(3, 0.0, 0)


# --- runs against the stand-in ----------------------------------------------------------------------


def _check_ok(spec: LoadSpec, df: pl.DataFrame) -> None:
    assert df.columns == list(FRAME_SCHEMA)
    assert dict(df.schema) == FRAME_SCHEMA
    assert df["status"].to_list() == ["ok"] * len(spec.prompts)
    assert df["error"].null_count() == len(df)
    by_id = dict(zip(spec.request_ids, spec.prompts, strict=True))
    for row in df.iter_rows(named=True):
        assert row["prompt_tokens"] == len(by_id[row["request_id"]])
        assert row["completion_tokens"] == spec.output_len
        assert row["replica"] == spec.replica


def test_all_at_once_streaming(standin: type[StandInCompletionsServer]) -> None:
    srv = standin(token_delay_s=0.005)
    n = 16
    spec = _spec(srv.base_url, n, output_len=10, replica=3)
    res = run_load(spec)
    df = to_frame(res)
    _check_ok(spec, df)
    assert srv.n_requests == n and srv.max_active == n
    assert res.peak_inflight == n and res.inflight_ok
    assert res.n_ok == n and res.n_error == 0 and res.warmup_done == 0
    assert df["request_id"].to_list() == spec.request_ids
    for r in df.iter_rows(named=True):
        assert r["scheduled_s"] == 0.0
        assert r["scheduled_s"] <= r["sent_s"] <= r["first_token_s"] <= r["end_s"]
        assert r["n_chunks"] == 10
        assert r["ttft_s"] >= 0.005 * 0.9
        assert r["latency_s"] >= 10 * 0.005 * 0.9
        assert r["tpot_s"] == pytest.approx((r["end_s"] - r["first_token_s"]) / 9)
        assert 0 < r["itl_max_s"] < 1.0
    assert res.lag_p99_s is not None and res.lag_p50_s is not None and res.lag_max_s is not None
    assert 0 <= res.lag_p50_s <= res.lag_p99_s <= res.lag_max_s
    assert res.lag_ok == (res.lag_p99_s < spec.lag_threshold_s)
    assert res.duration_s is not None and res.duration_s >= 10 * 0.005 * 0.9
    meta = result_meta(res)
    assert json.loads(json.dumps(meta)) == meta
    assert meta["peak_inflight"] == n and meta["n_ok"] == n and meta["inflight_ok"] is True
    assert abs(meta["t0_wall"] - time.time()) < 60 and meta["t0_mono"] <= time.monotonic()


def test_concurrency_limit_counts_wait_as_latency(standin: type[StandInCompletionsServer]) -> None:
    srv = standin(token_delay_s=0.01)
    spec = _spec(srv.base_url, 6, output_len=5, concurrency=2)
    res = run_load(spec)
    df = to_frame(res)
    _check_ok(spec, df)
    assert srv.max_active == 2 and res.peak_inflight == 2 and res.inflight_ok
    df = df.sort("sent_s").with_columns(
        service_s=pl.col("end_s") - pl.col("sent_s"), wait_s=pl.col("sent_s") - pl.col("scheduled_s")
    )
    later = df.slice(2)
    assert (later["wait_s"] > 0.03).all()
    assert (later["latency_s"] > later["service_s"] + 0.03).all()
    # the last pair waited for two earlier pairs
    assert (df.slice(4)["wait_s"] > 2 * 5 * 0.01 * 0.9).all()
    # lag counts from the slot being freed, not from the scheduled time
    assert res.lag_max_s is not None and res.lag_max_s < 0.05


def test_warmup_not_in_records(standin: type[StandInCompletionsServer]) -> None:
    srv = standin()
    spec = _spec(srv.base_url, 5, warmup=3, output_len=4)
    res = run_load(spec)
    df = to_frame(res)
    _check_ok(spec, df)
    assert srv.n_requests == 5 + 3
    assert res.warmup_done == 3
    assert len(res.records) == 5 and sorted(df["request_id"].to_list()) == spec.request_ids


def test_on_measure_runs_between_the_warmup_and_the_measured_requests(
    standin: type[StandInCompletionsServer],
) -> None:
    srv = standin()
    seen: list[int] = []
    res = run_load(_spec(srv.base_url, 5, warmup=3, output_len=4), on_measure=lambda: seen.append(srv.n_requests))
    assert seen == [3] and srv.n_requests == 8 and res.n_ok == 5


def test_a_poller_reads_at_once_when_asked_and_stops_at_once(standin: type[StandInCompletionsServer]) -> None:
    """``read_now`` gets a read that begins after the call, though the next poll is an hour away, and the exit
    wakes the thread rather than waiting the hour out."""
    srv = standin()
    poller = enginemetrics.GaugePoller(srv.base_url, interval_s=3600.0, keep=(RUNNING,))
    poller.__enter__()
    assert poller.read_now() is True  # the thread's first read, or one after it where that was under way
    before, asked = len(poller.kept), time.monotonic()
    assert poller.read_now() is True
    assert len(poller.kept) == before + 1 and poller.kept[-1][0] >= asked and RUNNING in poller.kept[-1][1]
    stopper = threading.Thread(target=poller.__exit__)
    stopper.start()
    stopper.join(timeout=60.0)
    assert not stopper.is_alive() and not poller._thread.is_alive() and len(poller.samples) == before + 1


def test_the_counters_of_a_repeat_leave_out_its_warmup(standin: type[StandInCompletionsServer]) -> None:
    """measure's ``server_counters`` span the measured requests only: the server here counts the requests
    it received as its counter."""
    from slmserve import measure

    srv = standin()

    class Server:  # the parts of VllmServer that measure() uses, over the stand-in
        base_url = srv.base_url

        def counters(self) -> dict[str, float]:
            return {"vllm:request_success_total": float(srv.n_requests)}

        def info(self) -> dict[str, Any]:
            return {}

        def alive(self) -> bool:
            return True

    m = measure.measure([Server()], [_spec(srv.base_url, 5, warmup=3, output_len=4)], [],  # type: ignore[list-item]
                        interval_s=1.0, sample=False, where="stand-in")  # fmt: skip
    assert m.meta["server_counters"] == [{"vllm:request_success_total": 5.0}]
    assert m.meta["counters_after_warmup"] is True and srv.n_requests == 8


def test_poisson_arrivals(standin: type[StandInCompletionsServer]) -> None:
    srv = standin(token_delay_s=0.001)
    spec = _spec(srv.base_url, 20, rate=100.0, seed=3, output_len=4)
    res = run_load(spec)
    df = to_frame(res)
    _check_ok(spec, df)
    assert df["scheduled_s"].to_list() == schedule(20, 100.0, 3)
    assert (df["sent_s"] >= df["scheduled_s"]).all()
    assert res.inflight_ok  # not checked for Poisson arrivals
    assert res.lag_max_s is not None and res.lag_max_s < 0.05


def test_non_streaming(standin: type[StandInCompletionsServer]) -> None:
    srv = standin(token_delay_s=0.002)
    spec = _spec(srv.base_url, 4, stream=False, output_len=6)
    df = to_frame(run_load(spec))
    _check_ok(spec, df)
    assert df["first_token_s"].null_count() == 4
    assert df["ttft_s"].null_count() == 4 and df["tpot_s"].null_count() == 4
    assert (df["latency_s"] >= 6 * 0.002 * 0.9).all()


def test_spaced_json_is_decoded(standin: type[StandInCompletionsServer]) -> None:
    srv = standin(compact=False)
    spec = _spec(srv.base_url, 3, output_len=5)
    df = to_frame(run_load(spec))
    _check_ok(spec, df)
    assert df["n_chunks"].to_list() == [5, 5, 5]


def test_http_400_is_an_error_record(standin: type[StandInCompletionsServer]) -> None:
    srv = standin(fail_first_token=7)
    prompts = _prompts(6, first=1000)
    prompts[2] = [7, 1, 2]
    spec = _spec(srv.base_url, 6, prompts=prompts)
    res = run_load(spec)
    df = to_frame(res)
    assert res.n_ok == 5 and res.n_error == 1
    bad = df.filter(pl.col("status") == "error").row(0, named=True)
    assert bad["request_id"] == spec.request_ids[2]
    assert "400" in bad["error"] and "stand-in refuses" in bad["error"]
    assert df.filter(pl.col("status") == "ok")["completion_tokens"].to_list() == [8] * 5


def test_wrong_model_is_an_error(standin: type[StandInCompletionsServer]) -> None:
    srv = standin()
    spec = _spec(srv.base_url, 2)
    spec.model = "not-served"
    res = run_load(spec)
    assert res.n_error == 2 and all("HTTP 404" in (r.error or "") for r in res.records)


def test_dropped_stream_is_an_error(standin: type[StandInCompletionsServer]) -> None:
    srv = standin(drop_first_token=9, token_delay_s=0.005)
    prompts = _prompts(4, first=1000)
    prompts[1] = [9, 9, 9]
    spec = _spec(srv.base_url, 4, prompts=prompts, output_len=10)
    t = time.monotonic()
    res = run_load(spec)
    assert time.monotonic() - t < 5
    df = to_frame(res)
    assert res.n_ok == 3 and res.n_error == 1
    bad = df.filter(pl.col("status") == "error").row(0, named=True)
    assert bad["request_id"] == spec.request_ids[1]
    assert bad["error"] and bad["completion_tokens"] is None
    assert bad["first_token_s"] is not None and bad["end_s"] >= bad["first_token_s"]


def test_server_not_listening_fails_fast() -> None:
    base = f"http://127.0.0.1:{_free_port()}"
    for rate in (math.inf, 2.0):  # Poisson at 2/s would take ~15 s if the run did not abort
        spec = _spec(base, 30, rate=rate, warmup=2)
        t = time.monotonic()
        res = run_load(spec)
        assert time.monotonic() - t < 5
        assert res.n_error == 30 and res.n_ok == 0 and res.warmup_done == 0
        df = to_frame(res)
        assert df.height == 30 and df["error"].null_count() == 0
        assert df["end_s"].null_count() == 0


def test_server_dies_mid_run(standin: type[StandInCompletionsServer]) -> None:
    srv = standin(token_delay_s=0.02)
    spec = _spec(srv.base_url, 160, rate=20.0, seed=1, output_len=10)  # ~8 s of arrivals
    threading.Timer(0.5, srv.kill).start()
    t = time.monotonic()
    res = run_load(spec)
    assert time.monotonic() - t < 5  # aborted at the kill, not after the arrivals
    assert res.aborted
    assert res.n_ok + res.n_error == 160 and res.n_error > 100
    assert len(to_frame(res)) == 160


def test_stalled_stream_times_out(standin: type[StandInCompletionsServer]) -> None:
    srv = standin(stall_mid_token=5)
    prompts = _prompts(3, first=1000)
    prompts[0] = [5, 5]
    spec = _spec(srv.base_url, 3, prompts=prompts, stall_timeout_s=0.3)
    t = time.monotonic()
    res = run_load(spec)
    assert time.monotonic() - t < 3  # the stand-in stalls for 30 s
    assert [r.status for r in res.records] == ["error", "ok", "ok"]
    assert "timed out (stream stalled: no data for 0.3 s after a token)" in (res.records[0].error or "")
    assert res.records[0].first_token_s is not None
    assert not res.aborted


def test_a_stream_longer_than_the_stall_limit_is_not_cut(standin: type[StandInCompletionsServer]) -> None:
    srv = standin(token_delay_s=0.02)  # 50 tokens in 1 s, a chunk every 20 ms: never silent for 0.3 s
    res = run_load(_spec(srv.base_url, 2, output_len=50, stall_timeout_s=0.3))
    assert [r.status for r in res.records] == ["ok", "ok"]
    assert all(r.end_s - r.first_token_s > 0.9 for r in res.records)


def test_queued_request_waits_past_the_stall_limit(standin: type[StandInCompletionsServer]) -> None:
    # vLLM sends headers at once and nothing while a request waits to be scheduled: at b=1 the last of
    # 500 OPT-350M requests waited 311 s, past a 300 s socket-read limit (2026-11-24, H100)
    srv = standin(stall_first_token=5, stall_s=1.0)
    prompts = _prompts(2, first=1000)
    prompts[0] = [5, 5]
    res = run_load(_spec(srv.base_url, 2, prompts=prompts, stall_timeout_s=0.3))
    assert [r.status for r in res.records] == ["ok", "ok"]
    assert to_frame(res)["ttft_s"][0] >= 1.0


def test_first_token_is_bounded_by_the_total_timeout(standin: type[StandInCompletionsServer]) -> None:
    srv = standin(stall_first_token=5)
    prompts = _prompts(2, first=1000)
    prompts[0] = [5, 5]
    t = time.monotonic()
    res = run_load(_spec(srv.base_url, 2, prompts=prompts, stall_timeout_s=0.3, timeout_s=1.0))
    assert time.monotonic() - t < 5
    assert [r.status for r in res.records] == ["error", "ok"]
    assert "timed out" in (res.records[0].error or "")
    assert res.records[0].first_token_s is None


def test_single_token_and_flags(standin: type[StandInCompletionsServer]) -> None:
    srv = standin()
    spec = _spec(srv.base_url, 3, output_len=1, lag_threshold_s=0.0)
    res = run_load(spec)
    df = to_frame(res)
    _check_ok(spec, df)
    assert df["n_chunks"].to_list() == [1, 1, 1]
    assert df["tpot_s"].null_count() == 3 and df["itl_max_s"].null_count() == 3
    assert df["ttft_s"].null_count() == 0
    assert not res.lag_ok  # p99 lag cannot be below 0


def test_spec_validation() -> None:
    with pytest.raises(ValueError, match="request ids"):
        run_load(LoadSpec(base_url="http://127.0.0.1:1", model=MODEL, prompts=[[1]], request_ids=[], output_len=1))
    with pytest.raises(ValueError, match="concurrency"):
        run_load(_spec("http://127.0.0.1:1", 1, concurrency=0))


# --- SSE splitting and the request body ---------------------------------------------------------------


def test_sse_splitter_returns_complete_data_payloads() -> None:
    sse = SseSplitter()
    assert sse.feed(b'data: {"a":1}\n\ndata: {"b"') == [b'{"a":1}']  # the cut line waits
    assert sse.rest == b'data: {"b"'
    assert sse.feed(b':2}\n\n: a comment\nevent: x\ndata:{"c":3}  \n') == [b'{"b":2}', b'{"c":3}']
    assert not sse.done and sse.rest == b""
    assert sse.feed(b"data: [DONE]\n\n") == []
    assert sse.done


def test_sse_splitter_split_inside_the_prefix_and_a_cut_last_line() -> None:
    sse = SseSplitter()
    whole = b'data: {"x":1}\n\ndata: [DONE]\n\n'
    out = [p for i in range(len(whole)) for p in sse.feed(whole[i : i + 1])]  # one byte at a time
    assert out == [b'{"x":1}'] and sse.done and sse.rest == b""
    cut = SseSplitter()
    assert cut.feed(b'data: {"x":1}\n\ndata: {"y"') == [b'{"x":1}']
    assert cut.rest.strip() == b'data: {"y"'  # what the load generator reports as an incomplete last line
    assert not cut.done


def test_request_body_without_xargs_is_unchanged() -> None:
    assert json.dumps(request_body(MODEL, (1, 2), 8, True), separators=(",", ":")) == (
        '{"model":"stand-in-model","prompt":[1,2],"max_tokens":8,"ignore_eos":true,"temperature":0,'
        '"stream":true,"stream_options":{"include_usage":true}}'
    )
    assert _body(_spec("http://x", 1, prompts=[[1, 2]]), [1, 2]) == (
        b'{"model":"stand-in-model","prompt":[1,2],"max_tokens":8,"ignore_eos":true,"temperature":0,'
        b'"stream":true,"stream_options":{"include_usage":true}}'
    )
    assert "vllm_xargs" not in request_body(MODEL, [1], 8, False)


def test_request_body_carries_vllm_xargs() -> None:
    xargs = {"kv_probe": 1, "tag": "a"}
    body = request_body(MODEL, [1], 8, False, vllm_xargs=xargs)
    assert body["vllm_xargs"] == xargs and body["stream"] is False
    sent = json.loads(_body(_spec("http://x", 1, prompts=[[1]], vllm_xargs=xargs), [1]))
    assert sent["vllm_xargs"] == xargs
