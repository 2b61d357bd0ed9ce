"""Harness fidelity: does the project's load generator measure the throughput other clients measure?

On one vLLM server and one workload (N token-id prompts sent at once, at most B in flight, ``max_tokens``
output tokens with ``ignore_eos``), the clients take turns and their throughputs are compared:

* ``slmserve``: :mod:`slmserve.loadgen` as :func:`slmserve.runner.load_spec` drives it under
  ``batch_control: client`` (:func:`slmserve_spec`, :func:`slmserve_client`);
* ``vllm-bench``: ``vllm bench serve`` in a subprocess (:func:`vllm_bench_client`). Offline and without a
  tokenizer it runs only as ``--skip-tokenizer-init --dataset-name custom`` on token-id prompts, with
  ``max_tokens``/``ignore_eos`` forced through ``--extra-body``; it always streams and needs pandas.
  :data:`BENCH_LAUNCHER` stands in for the ``vllm`` console script, which the CPU wheel breaks, and runs
  under ``python -O`` (vLLM 0.26.0 asserts a tokenizer even under ``--skip-tokenizer-init``);
* ``minimal``: a non-streaming aiohttp client with a semaphore (:func:`minimal_client`);
* ``minimal-stream`` (only when asked for): the same client sending the load generator's streaming requests
  (``stream: true``, usage in the last chunk), so that the server does for it the work it does for ``slmserve``;
* ``server-cap`` (only when asked for): the load generator without a client-side cap, every request sent at
  once so that the server's ``--max-num-seqs`` holds the batch, as under ``batch_control: restart``.

Every client warms up with the same requests first. A response counts as completed only with
``usage.completion_tokens == max_tokens``. Throughput is defined once, in :class:`RunResult`.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io as _io
import json
import math
import os
import queue
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import polars as pl
import psutil

from slmserve import analysis, enginemetrics, io, loadgen, runner, stats
from slmserve.loadgen import LoadSpec, run_load_async, to_frame
from slmserve.measure import lag_threshold_s, until_server_dies
from slmserve.server import pdeathsig

SUBJECT = "slmserve"
VLLM_BENCH = "vllm-bench"
MINIMAL = "minimal"
MINIMAL_STREAM = "minimal-stream"
SERVER_CAP = "server-cap"
CLIENTS = (SUBJECT, VLLM_BENCH, MINIMAL, SERVER_CAP, MINIMAL_STREAM)
DEFAULT_CLIENTS = (SUBJECT, VLLM_BENCH, MINIMAL)
TOLERANCE = 0.02

CSV_COLUMNS = (
    "batch", "repeat", "client", "n", "ok", "throughput_rps", "output_tok_s", "duration_s",
    "window_rps", "peak_inflight", "error", "host_speed_ms", "host_steal_frac", "server_requests", "server_e2e_s",
    "mean_inflight", "server_measured_requests", "server_measured_e2e_s", "client_cpu_frac", "api_server_cpu_frac",
    "engine_cpu_frac",
)  # fmt: skip

# What `vllm bench serve` runs (vllm/entrypoints/cli/benchmark/serve.py), without the `vllm` console script.
# Run under ``python -O``: vLLM 0.26.0's ``main_async`` asserts a tokenizer even under its own
# ``--skip-tokenizer-init``, though its custom dataset and metrics have a tokenizer-free path (0.32 has not).
BENCH_LAUNCHER = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "p = FlexibleArgumentParser(prog='vllm bench serve'); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)

_HEADERS = {"Content-Type": "application/json"}
_T = TypeVar("_T")


class BenchUnavailable(RuntimeError):
    """``vllm bench serve`` could not run (missing module, refused arguments, no result file)."""


@dataclass
class RunResult:
    """One measured run of one client."""

    client: str
    n: int
    ok: int
    duration_s: float | None
    throughput_rps: float | None
    """The client's own throughput: completed / (last end - first send) for ``slmserve`` and the minimal clients,
    vLLM's ``request_throughput`` (completed / its benchmark duration, which starts earlier) for ``vllm-bench``."""
    output_tok_s: float | None
    output_tokens: int
    peak_inflight: int | None = None
    error: str | None = None
    """The first failure, if any."""
    window_rps: float | None = None
    """Completed requests / (last end - first send) of the completed requests, for every client."""
    host_speed_ms: float | None = None
    """The host's Python speed around the run (:func:`slmserve.provenance.time_host_ms` just before it and just
    after it, their mean; lower is faster), as the workflow's ``host_speed_repeat_ms``."""
    host_steal_frac: float | None = None
    """The host's CPU steal over the run (:func:`slmserve.telemetry.steal_frac`; for ``vllm-bench`` its
    process's start-up included)."""
    server_requests: int | None = None
    """Requests the server finished during the run, warm-up included (:func:`server_latency`)."""
    server_e2e_s: float | None = None
    """Their mean latency by the server's own clock (:func:`server_latency`)."""
    mean_inflight: float | None = None
    """The requests the client kept in flight, on the mean over its window (:func:`mean_inflight`)."""
    server_measured_requests: int | None = None
    """Requests the server finished after the run's warm-up (:func:`measured_latency`)."""
    server_measured_e2e_s: float | None = None
    """Their mean latency by the server's own clock, the warm-up left out (:func:`measured_latency`)."""
    client_cpu_frac: float | None = None
    """Cores the client's process used while its measured requests were served (:func:`measured_cpu`)."""
    api_server_cpu_frac: float | None = None
    """Cores vLLM's API server process used meanwhile (:func:`measured_cpu`)."""
    engine_cpu_frac: float | None = None
    """Cores the server's other processes (its engine core) used meanwhile (:func:`measured_cpu`)."""

    def __post_init__(self) -> None:
        if self.window_rps is None and self.client != VLLM_BENCH:
            self.window_rps = self.throughput_rps

    def row(self, batch: int, repeat: int) -> dict[str, Any]:
        d = asdict(self)
        return {"batch": batch, "repeat": repeat, **{k: d[k] for k in CSV_COLUMNS if k in d}}


def mean_inflight(spans: Iterable[tuple[float, float]]) -> float | None:
    """Mean requests in flight over a run's window, from the client's (send, end) of each completed request:
    ``sum(end - send) / (last end - first send)``. Every such request lies inside that window, so this is
    the exact time average of the client's in-flight count (Little's law, ``L = throughput x mean time in
    flight``): the batch the client kept at the server, the last round's drain included, at most its cap.
    A throughput ratio between two clients is their ``mean_inflight`` ratio over their time-in-flight ratio,
    so it says whether a gap is the load a client keeps or how fast its requests came back. None without a
    completed request or a window."""
    pairs = list(spans)
    if not pairs:
        return None
    window = max(e for _, e in pairs) - min(s for s, _ in pairs)
    return sum(e - s for s, e in pairs) / window if window > 0 else None


# --- workload --------------------------------------------------------------------------------------


def requests_for(batch: int, available: int, requests: int | Mapping[int, int] | None = None) -> int:
    """Measured requests at ``batch``: ``requests`` if given (one count for every batch, or per batch; a
    batch it omits falls back), else 8 rounds of the batch (at least 64), at most the prompts available."""
    if isinstance(requests, Mapping):
        requests = requests.get(batch)
    n = requests if requests is not None else max(64, 8 * batch)
    return min(n, available)


def parse_requests(values: Sequence[str] | None) -> int | dict[int, int] | None:
    """``--requests``: one count ``N`` for every batch, or ``B=N`` pairs per batch (others: the default)."""
    if not values:
        return None
    if len(values) == 1 and "=" not in values[0]:
        return _positive(values[0], "--requests")
    counts: dict[int, int] = {}
    for value in values:
        batch, sep, n = value.partition("=")
        if not sep:
            raise ValueError(f"--requests {' '.join(values)}: give one count N, or B=N per batch (not {value!r})")
        b = _positive(batch, f"--requests {value}: batch")
        if b in counts:
            raise ValueError(f"--requests: batch {b} given twice")
        counts[b] = _positive(n, f"--requests {value}: count")
    return counts


def _positive(text: str, what: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{what}: {text!r} is not a positive integer")
    return int(text)


def plan(batches: Sequence[int], repeats: int, interleave: bool) -> list[tuple[int, int]]:
    """The (batch, repeat) runs in order: every repeat of one batch before the next, or with ``interleave``
    one repeat of every batch, then the next (a drift, or a lease that ends early, falls on every batch)."""
    if interleave:
        return [(b, r) for r in range(repeats) for b in batches]
    return [(b, r) for b in batches for r in range(repeats)]


def load_prompts(path: Path, input_len: int) -> list[list[int]]:
    """Token ids of every prompt in the prepared prompts parquet, cut to ``input_len`` tokens."""
    ids = pl.read_parquet(runner.require_prompts(path), columns=["token_ids"])["token_ids"].to_list()
    short = sum(1 for p in ids if len(p) < input_len)
    if short:
        raise ValueError(f"{path}: {short} prompts have fewer than {input_len} tokens")
    return [list(p[:input_len]) for p in ids]


def request_body(model: str, prompt: Sequence[int], output_len: int, stream: bool = False) -> dict[str, Any]:
    """The minimal client's request: what :mod:`slmserve.loadgen` sends, with ``stream: false`` unless ``stream``
    (then ``stream_options: {include_usage: true}`` too)."""
    return loadgen.request_body(model, prompt, output_len, stream=stream)


async def guarded(coro: Coroutine[Any, Any, _T], alive: Callable[[], bool] | None, poll_s: float = 0.5) -> _T:
    """Await ``coro``; with ``alive``, cancel it and raise as soon as the server dies
    (:func:`slmserve.measure.until_server_dies`)."""
    if alive is None:
        return await coro
    return await until_server_dies(coro, alive, poll_s)


# --- the minimal client ----------------------------------------------------------------------------


@dataclass
class _Sent:
    send: float
    end: float
    completion_tokens: int | None
    error: str | None


class _Inflight:
    def __init__(self) -> None:
        self.now = 0
        self.peak = 0


def stream_usage(body: bytes) -> tuple[int | None, str | None]:
    """``usage.completion_tokens`` of a streamed completion's whole body, from the last ``data:`` line carrying
    ``usage`` before the closing ``data: [DONE]``, or None and why there is none. Lines are read from the end,
    and only those naming ``usage`` are decoded (one, for vLLM's streams)."""
    lines = (line.strip() for line in reversed(body.splitlines()))
    payloads = (line[5:].strip() for line in lines if line.startswith(b"data:"))
    if next(payloads, None) != b"[DONE]":
        return None, "stream ended without data: [DONE]"
    last = None
    for payload in payloads:
        last = last or payload  # the stream's last data line, for the error
        if b'"usage"' in payload:
            chunk = json.loads(payload)
            usage = chunk.get("usage") if isinstance(chunk, dict) else None
            if isinstance(usage, dict) and usage:
                return usage.get("completion_tokens"), None
    excerpt = "" if last is None else f" (last data: {last[:200].decode('utf-8', 'replace')})"
    return None, f"stream without usage before data: [DONE]{excerpt}"


async def _post(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    expected: int,
    sem: asyncio.Semaphore,
    count: _Inflight,
    stream: bool = False,
) -> _Sent:
    async with sem:
        count.now += 1
        count.peak = max(count.peak, count.now)
        send = time.perf_counter()
        try:
            async with session.post(url, data=body, headers=_HEADERS) as resp:
                raw = await resp.read()  # a stream too: its chunks as they come, until it ends
                end = time.perf_counter()
                if resp.status != 200:
                    return _Sent(send, end, None, f"HTTP {resp.status}: {raw[:300].decode('utf-8', 'replace')}")
                if stream:
                    tokens, error = stream_usage(raw)
                    if error is not None:
                        return _Sent(send, end, None, error[:300])
                else:
                    tokens = (json.loads(raw).get("usage") or {}).get("completion_tokens")
                if tokens != expected:
                    return _Sent(send, end, tokens, f"usage.completion_tokens = {tokens}, expected {expected}")
                return _Sent(send, end, tokens, None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            return _Sent(send, time.perf_counter(), None, f"{type(exc).__name__}: {exc}"[:300])
        finally:
            count.now -= 1


async def _send_all(
    session: aiohttp.ClientSession,
    url: str,
    bodies: Sequence[bytes],
    expected: int,
    concurrency: int,
    stream: bool = False,
) -> tuple[list[_Sent], int]:
    sem = asyncio.Semaphore(concurrency)
    count = _Inflight()
    sent = await asyncio.gather(*(_post(session, url, b, expected, sem, count, stream) for b in bodies))
    return list(sent), count.peak


async def minimal_client(
    base_url: str,
    model: str,
    prompts: Sequence[Sequence[int]],
    output_len: int,
    concurrency: int,
    *,
    warmup: int = 0,
    timeout_s: float = 3600.0,
    stream: bool = False,
    on_measure: Callable[[], object] | None = None,
) -> RunResult:
    """Send every prompt at once, at most ``concurrency`` in flight, after ``warmup`` requests (the first
    prompts, cyclically) that are not measured, and ``on_measure`` in a thread between the two, as the load
    generator does. Throughput = completed / (last end - first send) of the completed requests (all of them
    when none failed).
    With ``stream`` (client ``minimal-stream``): the load generator's streaming body; a request ends when its
    stream does, its tokens the usage of the last chunk before ``[DONE]`` (:func:`stream_usage`)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    url = base_url.rstrip("/") + "/v1/completions"
    bodies = [json.dumps(request_body(model, p, output_len, stream), separators=(",", ":")).encode() for p in prompts]
    warm = [bodies[i % len(bodies)] for i in range(warmup)] if bodies else []
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        if warm:
            await _send_all(session, url, warm, output_len, concurrency, stream)
        if on_measure is not None:
            await asyncio.to_thread(on_measure)
        sent, peak = await _send_all(session, url, bodies, output_len, concurrency, stream)
    ok = [s for s in sent if s.error is None]
    errors = [s.error for s in sent if s.error is not None]
    duration = (max(s.end for s in ok) - min(s.send for s in ok)) if ok else None
    tokens = sum(s.completion_tokens or 0 for s in ok)
    return RunResult(
        client=MINIMAL_STREAM if stream else MINIMAL,
        n=len(sent),
        ok=len(ok),
        duration_s=duration,
        throughput_rps=len(ok) / duration if duration else None,
        output_tok_s=tokens / duration if duration else None,
        output_tokens=tokens,
        peak_inflight=peak,
        error=errors[0] if errors else None,
        mean_inflight=mean_inflight((s.send, s.end) for s in ok),
    )


# --- the project's load generator ------------------------------------------------------------------


def slmserve_spec(
    base_url: str,
    model: str,
    prompts: Sequence[Sequence[int]],
    output_len: int,
    batch: int,
    *,
    warmup_requests: int = 8,
    stream: bool = True,
    client_cap: bool = True,
) -> LoadSpec:
    """The :class:`LoadSpec` that :func:`slmserve.runner.load_spec` builds for ``batch_control: client`` at
    an infinite arrival rate (the whole batch in flight, the client holding it at ``batch``).
    Without ``client_cap``: ``batch_control: restart``'s load, the server's ``--max-num-seqs`` holding the batch."""
    n = len(prompts)
    return LoadSpec(
        base_url=base_url,
        model=model,
        prompts=[list(p) for p in prompts],
        request_ids=list(range(n)),
        output_len=output_len,
        rate=math.inf,
        concurrency=batch if client_cap else None,
        seed=0,
        stream=stream,
        warmup=runner.warmup_for(warmup_requests, batch, n),
        lag_threshold_s=lag_threshold_s(min(n, batch)) if client_cap else lag_threshold_s(n),
    )


async def slmserve_client(
    spec: LoadSpec, client: str = SUBJECT, on_measure: Callable[[], object] | None = None
) -> RunResult:
    """Run the load generator (``on_measure`` as :func:`slmserve.loadgen.run_load_async`); throughput and
    window as :func:`slmserve.analysis.request_metrics`; the result's client is ``client``."""
    result = await run_load_async(spec, on_measure)
    frame = to_frame(result)
    m = analysis.request_metrics(frame)
    full = pl.col("completion_tokens") == spec.output_len
    bad, done = (frame.filter(pl.col("status") == "ok", cond) for cond in (~full, full))
    errors = [r.error for r in result.records if r.status != "ok"]
    if bad.height:
        errors.append(f"{bad.height} responses with completion_tokens != {spec.output_len}")
    return RunResult(
        client=client,
        n=len(result.records),
        ok=m["n_ok"] - bad.height,
        duration_s=m["duration_s"],
        throughput_rps=m["throughput_rps"],
        output_tok_s=m.get("output_tok_s"),
        output_tokens=m.get("output_tokens") or 0,
        peak_inflight=result.peak_inflight,
        error=errors[0] if errors else None,
        mean_inflight=mean_inflight(zip(done["sent_s"], done["end_s"], strict=True)),
    )


# --- vLLM's own benchmark client -------------------------------------------------------------------


def write_bench_prompts(path: Path, prompts: Sequence[Sequence[int]]) -> None:
    """The prompts as ``vllm bench serve``'s custom dataset: one ``{"prompt": [token ids]}`` per line."""
    io.atomic_write_text(path, "".join(json.dumps({"prompt": list(p)}) + "\n" for p in prompts))


def bench_command(*, python: str = sys.executable, **args: Any) -> list[str]:
    """``vllm bench serve`` with token-id prompts and no tokenizer (see the module docstring), as a process:
    :func:`bench_launcher` then :func:`bench_args` of ``args``."""
    return [*bench_launcher(python), *bench_args(**args)]


def bench_launcher(python: str = sys.executable) -> list[str]:
    """The command line before the arguments of a ``vllm bench serve`` process (-O: see :data:`BENCH_LAUNCHER`)."""
    return [python, "-O", "-c", BENCH_LAUNCHER]


def bench_args(
    *,
    base_url: str,
    model: str,
    dataset: Path,
    n: int,
    output_len: int,
    concurrency: int,
    warmup: int,
    result_dir: Path,
    result_file: str,
) -> list[str]:
    """The arguments of ``vllm bench serve`` for one run, for a process (:func:`bench_command`) or a
    :class:`BenchWorker` alike."""
    extra = {"max_tokens": output_len, "ignore_eos": True}
    return [
        "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", model, "--served-model-name", model,
        "--skip-tokenizer-init",
        "--dataset-name", "custom", "--dataset-path", str(dataset), "--disable-shuffle", "--no-oversample",
        "--num-prompts", str(n),
        "--request-rate", "inf", "--max-concurrency", str(concurrency), "--num-warmups", str(warmup),
        "--ignore-eos", "--temperature", "0", "--extra-body", json.dumps(extra),
        "--disable-tqdm", "--save-result", "--save-detailed",
        "--result-dir", str(result_dir), "--result-filename", result_file,
    ]  # fmt: skip


def request_latencies(obj: Mapping[str, Any]) -> list[float] | None:
    """Each request's latency in a ``vllm bench serve --save-detailed`` JSON: ``latencies`` where it is saved,
    else ``ttfts`` plus the sum of ``itls`` (vLLM 0.26.0 saves only these; their sum is the time to the last
    chunk, which is how vLLM's client measures a latency)."""
    if obj.get("latencies"):
        return [float(x) for x in obj["latencies"]]
    ttfts, itls = obj.get("ttfts"), obj.get("itls")
    if not ttfts or itls is None or len(ttfts) != len(itls):
        return None
    return [float(t) + float(sum(i)) for t, i in zip(ttfts, itls, strict=True)]


def parse_bench_result(obj: Mapping[str, Any], n: int, output_len: int) -> RunResult:
    """A :class:`RunResult` from the JSON that ``vllm bench serve --save-result --save-detailed`` writes.

    Throughput is vLLM's own ``request_throughput`` (completed / its benchmark duration, which starts before
    the first request is sent); ``window_rps`` is the project's definition on its per-request send times and
    latencies. A completed request whose ``output_lens`` entry (the server's ``usage.completion_tokens``) is not
    ``output_len`` is not counted as ok."""
    completed = int(obj["completed"])
    lens = obj.get("output_lens")
    ok = completed if lens is None else sum(1 for x in lens if x == output_len)
    window_rps = inflight = None
    starts, latencies = obj.get("start_times"), request_latencies(obj)
    if lens is not None and starts and latencies and len(starts) == len(latencies) == len(lens):
        good = [(s, s + lat) for s, lat, x in zip(starts, latencies, lens, strict=True) if x == output_len]
        window = max(e for _, e in good) - min(s for s, _ in good) if good else 0.0
        window_rps = len(good) / window if window > 0 else None
        inflight = mean_inflight(good)
    errors = [str(e)[-300:] for e in obj.get("errors") or [] if e]
    if ok < completed:
        errors.append(f"{completed - ok} responses with completion_tokens != {output_len}")
    duration = obj.get("duration")
    return RunResult(
        client=VLLM_BENCH,
        n=n,
        ok=ok,
        duration_s=float(duration) if duration is not None else None,
        throughput_rps=float(obj["request_throughput"]) if completed else None,
        output_tok_s=float(obj["output_throughput"]) if completed else None,
        output_tokens=int(obj.get("total_output_tokens") or 0),
        peak_inflight=None,  # its max_concurrent_requests counts requests active within one whole second
        error=errors[0] if errors else None,
        window_rps=window_rps,
        mean_inflight=inflight,
    )


def turns(clients: Sequence[str], repeat: int) -> list[str]:
    """The clients' order in ``repeat``: rotated by one each repeat, so no client always goes first (with
    two, they alternate) and a drift within a repeat falls on all of them."""
    k = repeat % len(clients) if clients else 0
    return [*clients[k:], *clients[:k]]


def run_tag(client: str, batch: int, repeat: int) -> str:
    """The name of one client's run at ``batch``, ``repeat``: its log and result files are named after it."""
    return f"{client}-bs{batch}-r{repeat}"


def bench_result_path(workdir: Path, batch: int, repeat: int) -> Path:
    """Where :func:`vllm_bench_client` leaves the result JSON of the run at ``batch``, ``repeat``."""
    return workdir / f"{run_tag(VLLM_BENCH, batch, repeat)}.json"


FROM_BENCH_JSON = ("window_rps", "mean_inflight")


def fill_from_bench_json(rows: Sequence[Mapping[str, Any]], workdir: Path, output_len: int) -> list[dict[str, Any]]:
    """``rows`` with the :data:`FROM_BENCH_JSON` fields (``window_rps``, ``mean_inflight``) of each ``vllm bench
    serve`` run that lacks one taken from the result JSON the run left in ``workdir`` (:func:`parse_bench_result`),
    e.g. runs parsed before ``itls`` were read or before ``mean_inflight`` existed."""
    out = []
    for row in rows:
        path = bench_result_path(workdir, row["batch"], row["repeat"])
        missing = [k for k in FROM_BENCH_JSON if row.get(k) is None]
        if row["client"] == VLLM_BENCH and missing and path.exists():
            res = asdict(parse_bench_result(json.loads(path.read_text()), int(row["n"]), output_len))
            row = {**row, **{k: res[k] for k in missing}}
        out.append(dict(row))
    return out


_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
WORKER_SCRIPT = Path(__file__).with_name("vllm_bench_worker.py")


class BenchWorker:
    """One ``vllm bench serve`` process that runs many times (``bench/vllm_bench_worker.py``): vLLM is imported
    once, at :meth:`start`, instead of once per run. A run is vLLM's own ``main`` on the arguments a separate
    process gets (:func:`bench_args`); what it measures is timed inside it, so only the wall time between runs
    changes. Use it as a context manager; the process ends at :meth:`close`, and with the process that started
    it (``PR_SET_PDEATHSIG`` and the end of its stdin)."""

    def __init__(self, log_path: Path, python: str = sys.executable, ready_timeout_s: float = 900.0) -> None:
        self.log_path, self.python, self.ready_timeout_s = log_path, python, ready_timeout_s
        self._proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._ready = False

    def start(self) -> BenchWorker:
        """Start the process; it imports vLLM meanwhile (waited for at the first :meth:`run`)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._lines, self._ready = queue.Queue(), False
        with self.log_path.open("w") as log:
            self._proc = subprocess.Popen(
                [self.python, "-O", str(WORKER_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, text=True, env={**os.environ, **_OFFLINE}, preexec_fn=pdeathsig,
            )  # fmt: skip
        threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True).start()
        return self

    @property
    def pid(self) -> int | None:
        """The worker's process id while it runs (the process a :class:`CpuProbe` reads as the client)."""
        return self._proc.pid if self._proc is not None else None

    def _read(self, stream: Any) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)  # end of output: the process ended

    def _answer(self, timeout_s: float, what: str) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            self.close(grace_s=0)  # hung: no end of stdin will be read
            why = f"vllm bench serve worker: no {what} in {timeout_s:.0f} s (log: {self.log_path})"
            raise BenchUnavailable(why) from None
        if line is None:
            code = self._proc.wait() if self._proc else None
            raise BenchUnavailable(f"{_why(self.log_path)} (worker exit code {code}; log: {self.log_path})")
        return json.loads(line)

    def run(self, argv: Sequence[str], log_path: Path, timeout_s: float) -> None:
        """One run of ``vllm bench serve`` on ``argv``, its output in ``log_path``. Raises
        :class:`BenchUnavailable` if the worker cannot start, the run fails, or it takes over ``timeout_s``."""
        if self._proc is None:
            self.start()
        assert self._proc is not None and self._proc.stdin is not None
        if not self._ready:
            self._answer(self.ready_timeout_s, "import of vLLM")
            self._ready = True
        try:
            self._proc.stdin.write(json.dumps({"argv": list(argv), "log": str(log_path)}) + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            self._lines.put(None)
        answer = self._answer(timeout_s, "result")
        if answer.get("rc") != 0:
            raise BenchUnavailable(f"{answer.get('error')} (log: {log_path})")

    def close(self, grace_s: float = 10.0) -> None:
        """End the process: the end of its stdin, then SIGKILL if it has not gone in ``grace_s``."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.stdin.close()  # type: ignore[union-attr]
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> BenchWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def vllm_bench_client(
    *,
    base_url: str,
    model: str,
    prompts: Sequence[Sequence[int]],
    output_len: int,
    concurrency: int,
    warmup: int,
    workdir: Path,
    tag: str,
    timeout_s: float = 3600.0,
    python: str = sys.executable,
    worker: BenchWorker | None = None,
    on_start: Callable[[int], object] | None = None,
) -> RunResult:
    """Run ``vllm bench serve`` once, offline (``HF_HUB_OFFLINE=1``): a process of its own, or a run of
    ``worker``; its output goes to ``workdir/tag.log``; ``on_start`` gets the process id of the process that runs
    it (the worker's, or the new process's as soon as it starts). Raises :class:`BenchUnavailable` if it does
    not produce a result."""
    dataset = workdir / f"prompts-in{len(prompts[0])}-n{len(prompts)}.jsonl"
    write_bench_prompts(dataset, prompts)
    result_file = f"{tag}.json"
    (workdir / result_file).unlink(missing_ok=True)
    argv = bench_args(
        base_url=base_url, model=model, dataset=dataset, n=len(prompts), output_len=output_len,
        concurrency=concurrency, warmup=warmup, result_dir=workdir, result_file=result_file,
    )  # fmt: skip
    log_path = workdir / f"{tag}.log"
    if worker is not None:
        log_path.write_text("# vllm bench serve (worker) " + " ".join(argv) + "\n")
        if on_start is not None and worker.pid is not None:
            on_start(worker.pid)
        worker.run(argv, log_path, timeout_s)
        code = 0
    else:
        cmd = [*bench_launcher(python), *argv]
        with log_path.open("w") as log:
            log.write("# " + " ".join(cmd) + "\n")
            log.flush()
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **_OFFLINE}, preexec_fn=pdeathsig,
            )  # fmt: skip
            if on_start is not None:
                on_start(proc.pid)
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired as exc:
                raise BenchUnavailable(f"vllm bench serve timed out after {timeout_s:.0f} s (log: {log_path})") from exc
            finally:
                if proc.poll() is None:  # timed out or interrupted (a signal, the server's death): it ends with the run
                    proc.kill()
                    proc.wait()
    if code != 0 or not (workdir / result_file).exists():
        raise BenchUnavailable(f"{_why(log_path)} (exit code {code}; log: {log_path})")
    obj = json.loads((workdir / result_file).read_text())
    return parse_bench_result(obj, len(prompts), output_len)


_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Exit)\b.*")


def _why(log_path: Path) -> str:
    """The last exception line of a failed run's log (else its last line that is not nanobind's leak report)."""
    try:
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines()]
    except OSError:
        return "no log"
    lines = [ln for ln in lines if ln and not ln.startswith(("- ", "nanobind:", "See https://nanobind"))]
    errors = [ln for ln in lines if _ERROR_LINE.match(ln)]
    return (errors or lines or ["empty log"])[-1][:500]


# --- summary ---------------------------------------------------------------------------------------


def cv(values: Sequence[float]) -> float | None:
    """Coefficient of variation: sample standard deviation / mean; ``None`` with fewer than two values."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else None


def _ratios(clients: Mapping[str, Mapping[str, Any]], subject: str, key: str) -> dict[str, float | None]:
    """mean(subject) / mean(other) of ``key`` for every other client."""
    mine = clients.get(subject, {}).get(key)
    return {name: mine / c[key] if mine and c.get(key) else None for name, c in clients.items() if name != subject}


def _values(rows: Sequence[Mapping[str, Any]], client: str, key: str) -> list[float]:
    """One client's measured ``key`` (``throughput_rps`` or ``window_rps``) over its repeats."""
    return [float(r[key]) for r in rows if r["client"] == client and r.get(key) is not None]


def _paired(rows: Sequence[Mapping[str, Any]], subject: str, reference: str, key: str) -> dict[str, Any]:
    """The ratio ``subject / reference`` of ``key`` within each repeat (the two clients back to back on the
    same server), over the repeats where both measured: :func:`slmserve.stats.describe` of those ratios
    (their mean and its 95% t-interval). Pairing removes what the two runs of a repeat share (the server's
    and the host's state at the time) from the interval. Rows pooled from several runs carry their
    ``source``: a repeat pairs only within its own source (repeat 0 of two machines is two pairs)."""
    return stats.describe([ratio for _, ratio in _pair_ratios(rows, subject, reference, key)])


def _pair_ratios(rows: Sequence[Mapping[str, Any]], subject: str, reference: str, key: str) -> list[tuple[str, float]]:
    """Each pair's ``source`` and its ratio ``subject / reference`` of ``key``; a pair whose reference is 0
    gives no ratio."""
    return [(str(a.get("source") or ""), float(a[key]) / float(b[key]))
            for a, b in _row_pairs(rows, subject, reference, (key,)) if b[key]]  # fmt: skip


def _pairs(rows: Sequence[Mapping[str, Any]], subject: str, reference: str, key: str) -> list[tuple[float, float]]:
    """``(subject's, reference's)`` value of ``key`` in each repeat (of each ``source``) where both have it."""
    return [(float(a[key]), float(b[key])) for a, b in _row_pairs(rows, subject, reference, (key,))]


def _row_pairs(
    rows: Sequence[Mapping[str, Any]], subject: str, reference: str, keys: Sequence[str]
) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """``(subject's, reference's)`` run in each repeat (of each ``source``) where both have every one of ``keys``."""
    by: dict[tuple[str, int], dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        if r["client"] in (subject, reference) and all(r.get(k) is not None for k in keys):
            by.setdefault((str(r.get("source") or ""), int(r["repeat"])), {})[str(r["client"])] = r
    return [(v[subject], v[reference]) for _, v in sorted(by.items()) if len(v) == 2]


def _ratios_by_source(
    rows: Sequence[Mapping[str, Any]], subject: str, reference: str, key: str
) -> tuple[list[float], list[str]]:
    """The pairs' ratios (:func:`_pair_ratios`) and, beside them, each one's ``source``."""
    kept = _pair_ratios(rows, subject, reference, key)
    return [ratio for _, ratio in kept], [source for source, _ in kept]


def between_sources(rows: Sequence[Mapping[str, Any]], subject: str, reference: str, key: str) -> dict[str, Any]:
    """Whether the pooled folders' pairs differ in mean ratio ``subject / reference`` of ``key``: the pairs'
    ratios (:func:`_paired`) grouped by their ``source``, :func:`slmserve.stats.between_groups` (the
    Alexander-Govern test, ``statistic`` and ``p``, with each source's mean and count). Pooling treats the
    pairs of every folder as one sample; a small ``p`` says a machine moves the ratio, and the pooled interval
    then understates how far another machine's would fall. One source gives no ``statistic`` (None)."""
    return stats.between_groups(*_ratios_by_source(rows, subject, reference, key))


def across_sources(
    rows: Sequence[Mapping[str, Any]], subject: str, reference: str, key: str, tolerance: float
) -> dict[str, Any]:
    """The pooled folders' mean ratio ``subject / reference`` of ``key`` with machines as a random effect:
    the pairs' ratios grouped by ``source`` (as :func:`between_sources` groups them), then
    :func:`slmserve.stats.across_groups` (``mean``, ``ci_lo``, ``ci_hi``, ``tau`` the SD of the machines'
    own ratios, ``i2``), judged at ``tolerance`` (``verdict``, ``equivalent``). Its CI is of the ratio on a
    machine drawn like these, so it widens when machines differ; the ``paired_*`` keys judge every pair as
    one sample, which holds only where they do not (:func:`pool_reading` asks both). One source gives ``mean``
    None (``inconclusive``)."""
    pooled = stats.across_groups(*_ratios_by_source(rows, subject, reference, key))
    return {**pooled, **_judgement("", pooled, tolerance)}


def pool_reading(batch: Mapping[str, Any]) -> dict[str, Any]:
    """A pool's verdict, fixed before its data: the claim that both of its readings make, the pairs as one
    sample (``paired_verdict``, ``paired_equivalent``) and the machines as a random effect
    (``across_sources``). ``pool_verdict`` is their verdict where they give the same one, else
    ``inconclusive``; ``pool_equivalent`` whether both CIs lie within ``1 ± tolerance``. The first reading
    holds only if the machines do not differ, which a test of a few machines cannot show; the second weighs
    each machine by its own pairs' spread, which a few pairs estimate poorly. Both ``None`` for one source."""
    across = batch["across_sources"]
    if across["mean"] is None:
        return {"pool_verdict": None, "pool_equivalent": None}
    same = batch["paired_verdict"] == across["verdict"]
    return {"pool_verdict": batch["paired_verdict"] if same else "inconclusive",
            "pool_equivalent": bool(batch["paired_equivalent"] and across["equivalent"])}  # fmt: skip


def _judgement(prefix: str, ci: Mapping[str, Any], tolerance: float) -> dict[str, Any]:
    """``<prefix>verdict`` and ``<prefix>equivalent`` of an interval ``ci`` (its ``ci_lo`` and ``ci_hi``)."""
    lo, hi = ci["ci_lo"], ci["ci_hi"]
    verdict, equivalent = stats.verdict(lo, hi, tolerance), stats.equivalent(lo, hi, tolerance)
    return {f"{prefix}verdict": verdict, f"{prefix}equivalent": equivalent}


def _within(ratio: float | None, tolerance: float) -> bool:
    """``|ratio - 1| <= tolerance``, the boundary included despite rounding (0.98 is within 2%)."""
    return ratio is not None and abs(ratio - 1.0) <= tolerance + 1e-12


def host_link(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Whether the runs' throughput follows the host's Python speed around them: Pearson's ``r`` between each
    run's ``host_speed_ms`` and ``throughput_rps`` within its client (and, pooled, its ``source``), so that
    what sets the clients and machines apart does not count (:func:`slmserve.stats.within_correlation`). A
    host-bound model runs slower on a slower host, so a clearly negative ``r`` says the spread between runs
    is the host's; also the range of ``host_speed_ms`` and the largest ``host_steal_frac``. No ``r`` for runs
    recorded without the host's speed (before 2026-12-03)."""
    timed = [r for r in rows if r.get("host_speed_ms") is not None and r.get("throughput_rps") is not None]
    speeds = [float(r["host_speed_ms"]) for r in timed]
    link = stats.within_correlation(speeds, [float(r["throughput_rps"]) for r in timed],
                                    [(str(r.get("source") or ""), str(r["client"])) for r in timed])  # fmt: skip
    steals = [float(r["host_steal_frac"]) for r in rows if r.get("host_steal_frac") is not None]
    return {**link, "host_speed_ms_min": min(speeds, default=None), "host_speed_ms_max": max(speeds, default=None),
            "host_steal_frac_max": max(steals, default=None)}  # fmt: skip


def pair_link(rows: Sequence[Mapping[str, Any]], subject: str) -> dict[str, Any]:
    """What the pairs' throughput ratios follow, against every other client: within each pair (the two
    clients' runs of one repeat), ``log(T_s / T_c)`` of ``throughput_rps`` against ``log(L_s / L_c)``, ``L``
    the server's mean latency (``server``: ``server_measured_e2e_s``, the warm-up left out, where any pair has
    it in both runs, else ``server_e2e_s``; ``latency_key`` names it), and against ``h_s - h_c``, the
    difference of the runs' ``host_speed_ms`` (``host``). Each is Pearson's ``r`` within sources
    (:func:`slmserve.stats.within_correlation`: a pool's machine offsets do not count), over the pairs that
    have both values (a latency of 0 counts as none; the latency key is chosen once for all pairs). An ``r``
    near -1 on ``server`` places the pairs' spread in the server's latency; with the load kept equal Little's
    law makes it so whatever slowed the server, so it does not tell an outside slowdown from one the client's
    own requests caused. ``host`` asks whether the host's timing around the runs goes with the ratio (a slower
    host for the subject gives a negative ``r``). No ``r`` with fewer than ``k + 4`` pairs (``k`` sources of two
    pairs or more), or where either value is constant within every source."""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(str(r["client"]) for r in rows if r["client"] != subject):
        both = [(a, b) for a, b in _row_pairs(rows, subject, name, ("throughput_rps",))
                if float(a["throughput_rps"]) > 0 and float(b["throughput_rps"]) > 0]  # fmt: skip
        key = "server_measured_e2e_s"
        if not any(a.get(key) and b.get(key) for a, b in both):
            key = "server_e2e_s"
        served = [(a, b) for a, b in both if a.get(key) and b.get(key)]
        timed = [(a, b) for a, b in both if a.get("host_speed_ms") is not None and b.get("host_speed_ms") is not None]
        out[name] = {
            "latency_key": key,
            "server": _pairs_follow(served, [math.log(float(a[key]) / float(b[key])) for a, b in served]),
            "host": _pairs_follow(timed, [float(a["host_speed_ms"]) - float(b["host_speed_ms"]) for a, b in timed]),
        }
    return out


def _pairs_follow(pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], xs: Sequence[float]) -> dict[str, Any]:
    """:func:`slmserve.stats.within_correlation` of ``xs`` (one per pair) with the pairs' log throughput ratio,
    within each pair's ``source``."""
    logs = [math.log(float(a["throughput_rps"]) / float(b["throughput_rps"])) for a, b in pairs]
    return stats.within_correlation(xs, logs, [str(a.get("source") or "") for a, _ in pairs])


E2E = "vllm:e2e_request_latency_seconds"


def server_latency(before: Mapping[str, float], after: Mapping[str, float]) -> tuple[int | None, float | None]:
    """Requests the server finished between two reads of its metrics (:func:`slmserve.enginemetrics.parse`),
    ``Δ vllm:e2e_request_latency_seconds_count``, and their mean latency by the server's clock, ``Δ ..._sum /
    Δ ..._count`` (from a request's arrival at vLLM's API server to its last output there, so no client's
    reading of the stream counts). Both read around a run, they take in its warm-up (and ``vllm bench serve``'s
    test request). ``(None, None)`` where a read failed or nothing finished."""
    delta = enginemetrics.counter_delta(
        {k: before[k] for k in before if k.startswith(E2E)}, {k: after[k] for k in after if k.startswith(E2E)}
    )
    if not delta or not delta.get(f"{E2E}_count"):
        return None, None
    n = delta[f"{E2E}_count"]
    return int(n), delta.get(f"{E2E}_sum", 0.0) / n


E2E_KEPT = (f"{E2E}_count", f"{E2E}_sum", enginemetrics.RUNNING)
"""The samples :func:`measured_latency` and :func:`measured_cpu` need from each read of a
:class:`slmserve.enginemetrics.GaugePoller`."""


def measured_latency(
    before: Mapping[str, float], reads: Sequence[tuple[float, Mapping[str, float]]], after: Mapping[str, float],
    warmup: int,
) -> tuple[int | None, float | None]:  # fmt: skip
    """:func:`server_latency` of the measured requests alone: from the first read polled during the run
    (``reads``, in order) at which the server had finished exactly the ``warmup`` requests since ``before``, to
    ``after``. Every client ends its whole warm-up before it sends a measured request, and a measured request
    takes at least one full generation: our clients take a read in that gap (``on_measure``,
    :meth:`slmserve.enginemetrics.GaugePoller.read_now`); for ``vllm bench serve`` a poll lands in it when it is
    longer than the poll interval (on the CPU engine at b=8: all 6 runs,
    ``bench/results/cpu-measured-latency-check/``). ``(None, None)`` where no read landed in it, a read failed,
    or nothing finished after it."""
    if warmup == 0:
        return server_latency(before, after)
    split = _split(before, reads, warmup)
    return (None, None) if split is None else server_latency(reads[split][1], after)


def _split(before: Mapping[str, float], reads: Sequence[tuple[float, Mapping[str, float]]], warmup: int) -> int | None:
    """The index of the first read in ``reads`` at which the server had finished exactly ``warmup`` requests
    since ``before`` (:func:`measured_latency`); None where none did or ``before`` failed."""
    count = f"{E2E}_count"
    if count not in before:
        return None
    hits = (i for i, (_, r) in enumerate(reads) if count in r and r[count] - before[count] == warmup)
    return next(hits, None)


# --- the processes' CPU over a run -----------------------------------------------------------------

CPU_READS = {"client_cpu_frac": "client_cpu_s", "api_server_cpu_frac": "api_server_cpu_s",
             "engine_cpu_frac": "engine_cpu_s"}  # fmt: skip
"""Each :class:`RunResult` CPU field and the reading of :class:`CpuProbe` it is worked out from."""


def process_cpu_s(pid: int | None, *, descendants: bool = False) -> float | None:
    """CPU seconds (user + system, every thread) that process ``pid`` has used so far, or with ``descendants``
    the sum over its living descendants (a vLLM server's engine core and workers); None without the process."""
    if pid is None:
        return None
    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) if descendants else [root]
    except psutil.Error:
        return None
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):  # one that ended after it was listed counts nothing
            times = proc.cpu_times()
            total += times.user + times.system
    return total


@dataclass
class CpuProbe:
    """What every poll of a run reads besides the server's counters (a :class:`slmserve.enginemetrics.GaugePoller`'s
    ``extra``): the CPU seconds so far of the client's process (``client``: this process, or ``vllm bench
    serve``'s, set for each run), of vLLM's API server (``server``) and of the server's other processes."""

    server: int | None
    client: int | None = None

    def __call__(self) -> dict[str, float]:
        reads = {
            "client_cpu_s": process_cpu_s(self.client),
            "api_server_cpu_s": process_cpu_s(self.server),
            "engine_cpu_s": process_cpu_s(self.server, descendants=True),
        }
        return {k: v for k, v in reads.items() if v is not None}


def measured_cpu(
    before: Mapping[str, float], reads: Sequence[tuple[float, Mapping[str, float]]], warmup: int
) -> dict[str, float | None]:
    """Cores each process used while a run's measured requests were served, for every :data:`CPU_READS`
    field: ``Δ CPU seconds / Δ t`` from the read at which the warm-up had finished (the split of
    :func:`measured_latency`; the first read without a warm-up) to the last read at which the server was
    still running requests (``vllm:num_requests_running`` > 0). So a client's start-up (``vllm bench serve``'s
    imports), its warm-up and what it works out after the last response stay outside. 1.0 is one core busy
    for the whole span: a client near it reads its responses late. None where the span is under a second (no
    two reads), a read lacks the process, or its descendants' CPU went down (one ended)."""
    none: dict[str, float | None] = dict.fromkeys(CPU_READS)
    first = 0 if warmup == 0 else _split(before, reads, warmup)
    if first is None or not reads:
        return none
    busy = [i for i, (_, r) in enumerate(reads) if i > first and r.get(enginemetrics.RUNNING, 0) > 0]
    if not busy:
        return none
    (t0, r0), (t1, r1) = reads[first], reads[busy[-1]]
    if t1 - t0 < enginemetrics.POLL_S:
        return none
    out = dict(none)
    for field, key in CPU_READS.items():
        if key in r0 and key in r1 and r1[key] >= r0[key]:
            out[field] = (r1[key] - r0[key]) / (t1 - t0)
    return out


def _each_client(
    rows: Sequence[Mapping[str, Any]], subject: str, key: str, compare: Callable[..., dict[str, Any]] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per client, the mean of its runs' ``key`` (None where no run has it), and against every other client
    ``compare(rows, subject, client, key)`` of it: the paired ratio ``subject / client`` (:func:`_paired`)
    unless given."""
    compare = _paired if compare is None else compare
    names = dict.fromkeys(str(r["client"]) for r in rows)
    values = {name: [float(r[key]) for r in rows if r["client"] == name and r.get(key) is not None] for name in names}
    means = {name: statistics.fmean(v) if v else None for name, v in values.items()}
    return means, {name: compare(rows, subject, name, key) for name in names if name != subject}


def _paired_difference(rows: Sequence[Mapping[str, Any]], subject: str, reference: str, key: str) -> dict[str, Any]:
    """As :func:`_paired`, of the difference ``subject - reference`` within each repeat."""
    return stats.describe([a - b for a, b in _pairs(rows, subject, reference, key)])


def server_side(rows: Sequence[Mapping[str, Any]], subject: str) -> dict[str, Any]:
    """Per client, the mean of its runs' ``server_e2e_s`` (``e2e_s``), and against every other client the
    paired ratio ``subject / client`` of it (``e2e_vs``); the same of ``server_measured_e2e_s``, the warm-up
    left out (``measured_e2e_s``, ``measured_e2e_vs``). With the batch held at B by both
    clients, a throughput ratio that this latency ratio mirrors (1.04 against 0.96) is the server serving
    one client's runs faster; a latency ratio of 1 beside it is the clients' load or accounting."""
    e2e, vs = _each_client(rows, subject, "server_e2e_s")
    measured, measured_vs = _each_client(rows, subject, "server_measured_e2e_s")
    return {"e2e_s": e2e, "e2e_vs": vs, "measured_e2e_s": measured, "measured_e2e_vs": measured_vs}


def load_side(rows: Sequence[Mapping[str, Any]], subject: str) -> dict[str, Any]:
    """Per client, the mean of its runs' :func:`mean_inflight` (``inflight``), and against every other
    client the paired ratio ``subject / client`` of it (``inflight_vs``): whether the clients kept the same
    load at the server. Host noise moves how fast requests come back, not how many are in flight, so this
    ratio is far steadier than the throughput's (m89: CV 0.9% of ``vllm bench serve``'s against 12%)."""
    inflight, vs = _each_client(rows, subject, "mean_inflight")
    return {"inflight": inflight, "inflight_vs": vs}


def client_lag(row: Mapping[str, Any]) -> float | None:
    """A run's mean time in flight at the client beyond the server's mean latency, in seconds:
    ``mean_inflight / window_rps - server latency``. ``mean_inflight / window_rps`` is exactly the client's
    ``sum(end - send) / completed`` (:func:`mean_inflight`). The server latency is the same requests' time by
    the server's clock: ``server_measured_e2e_s`` (:func:`measured_latency`) where the run has it, else
    ``server_e2e_s``, its warm-up of equal shape and concurrency mixed in (:func:`server_latency`; every run
    before 2026-12-04 evening). What is left is the client's share: the way to the server and back, and how
    late its event loop reads a response's end. Of two clients at one batch, the one with more lag reports
    less throughput for the same service. None where the run lacks one of them."""
    server = server_latency_of(row)
    inflight, window = row.get("mean_inflight"), row.get("window_rps")
    if inflight is None or not window or server is None:
        return None
    return float(inflight) / float(window) - server


def server_latency_of(row: Mapping[str, Any]) -> float | None:
    """A run's server latency as :func:`client_lag` takes it: ``server_measured_e2e_s`` where the run has it,
    else ``server_e2e_s``; None with neither."""
    server = row.get("server_measured_e2e_s")
    server = row.get("server_e2e_s") if server is None else server
    return None if server is None else float(server)


def equal_server_ratio(subject: Mapping[str, Any], reference: Mapping[str, Any]) -> float | None:
    """The throughput ratio of two runs of one repeat had the server been as fast for both: each client's
    throughput by Little's law, ``mean_inflight / (S + client_lag)``, with ``S`` the mean of the two runs' server
    latencies (:func:`server_latency_of`) in place of its own run's:
    ``(L_s / L_r) x (S + lag_r) / (S + lag_s)``. It keeps what each client did (the load it kept, the time it
    added to each request) and drops how fast the server happened to be from one run to the next, most of a
    host-bound pair's spread (m91, OPT-125M b=512: SD 3.9% a pair against 14.4% for the throughput ratio).
    What the server did differently for one client's requests is dropped with it: :func:`server_side`'s
    latency ratio holds that. None where a run lacks one of them."""
    lag_s, lag_r = client_lag(subject), client_lag(reference)
    server_s, server_r = server_latency_of(subject), server_latency_of(reference)
    if lag_s is None or lag_r is None or server_s is None or server_r is None or not reference.get("mean_inflight"):
        return None
    s = (server_s + server_r) / 2
    t_subject, t_reference = s + lag_s, s + lag_r
    if t_subject <= 0 or t_reference <= 0:
        return None
    return float(subject["mean_inflight"]) / float(reference["mean_inflight"]) * t_reference / t_subject


def equal_server(rows: Sequence[Mapping[str, Any]], subject: str, tolerance: float) -> dict[str, Any]:
    """Against every other client, :func:`equal_server_ratio` of each repeat: its mean, 95% t-interval
    (:func:`slmserve.stats.describe`), ``verdict`` and ``equivalent`` at ``tolerance``, as the throughput's
    paired ratio is judged, and ``n_needed``, the pairs a CI of ``± tolerance`` would take at its SD
    (:func:`slmserve.stats.repeats_for`). A decomposition beside the issue's criterion, not in its place."""
    names = dict.fromkeys(str(r["client"]) for r in rows if r["client"] != subject)
    out: dict[str, Any] = {}
    for name in names:
        pairs = _row_pairs(rows, subject, name, ("mean_inflight", "window_rps"))
        ratios = [x for x in (equal_server_ratio(a, b) for a, b in pairs) if x is not None]
        ci = stats.describe(ratios)
        out[name] = {**ci, **_judgement("", ci, tolerance), "n_needed": stats.repeats_for(ci["sd"], tolerance)}
    return out


def client_side(rows: Sequence[Mapping[str, Any]], subject: str) -> dict[str, Any]:
    """Per client, the mean of its runs' :func:`client_lag` (``lag_s``), and against every other client the
    paired difference ``subject - client`` of it (``lag_vs``, :func:`slmserve.stats.describe` of the
    repeats' differences: a lag can be near 0, so no ratio). Beside ``load_side`` it splits a throughput gap:
    same load and a lag difference is the clients' clocks, same lag is the server's speed."""
    lagged = [{**r, "client_lag_s": client_lag(r)} for r in rows]
    lag, vs = _each_client(lagged, subject, "client_lag_s", _paired_difference)
    return {"lag_s": lag, "lag_vs": vs}


def cpu_side(rows: Sequence[Mapping[str, Any]], subject: str) -> dict[str, Any]:
    """Per client, the mean of its runs' every :data:`CPU_READS` field (cores, :func:`measured_cpu`), and
    against every other client the paired difference ``subject - client`` of it (``<field>_vs``). A client
    whose process is near one core reads its responses late (its ``client_side`` lag); an API server busier
    for one client's requests serves them slower (its ``server_side`` latency)."""
    out: dict[str, Any] = {}
    for field in CPU_READS:
        out[field], out[f"{field}_vs"] = _each_client(rows, subject, field, _paired_difference)
    return out


def summarize(
    rows: Sequence[Mapping[str, Any]],
    *,
    subject: str = SUBJECT,
    reference: str = MINIMAL,
    tolerance: float = TOLERANCE,
) -> dict[str, Any]:
    """Per batch size: each client's mean throughput over its repeats, the CV of its repeats, and
    ``ratio`` = mean(subject) / mean(reference), on the window definition where the reference has it,
    its 95% CI (``ratio_ci_lo``, ``ratio_ci_hi``: :func:`slmserve.stats.ratio_ci`) and the ``verdict`` that
    CI gives at ``tolerance`` (:func:`slmserve.stats.verdict`: ``agree``, ``differ`` or ``inconclusive``;
    ``all_agree`` over the batches), ``equivalent`` whether that CI lies within ``1 ± tolerance``
    (:func:`slmserve.stats.equivalent`, the issue's "ratio within 0.98-1.02" at 95% confidence;
    ``all_equivalent``); ``within_tolerance`` = ``|ratio - 1| <= tolerance`` on the means alone
    (``ratios`` and ``within`` hold the same against every other client; ``window_ratios`` compare the
    throughputs on the project's window definition, ``window_rps``). The ``paired_*`` keys judge the same key
    repeat by repeat (:func:`_paired`): ``paired_ratio`` (the mean of the repeats' ratios, not a ratio of
    means), ``paired_n``, ``paired_ci_lo``/``paired_ci_hi``, ``paired_verdict`` and ``paired_equivalent``
    (``all_paired_equivalent``), ``paired_sd`` (the SD of the repeats' ratios) and ``paired_n_needed``, the
    pairs a CI of ``± tolerance`` would take at that SD (:func:`slmserve.stats.repeats_for`, a plan), and
    ``paired_n_inside``, the pairs that CI would take to lie inside ``1 ± tolerance`` were the mean to stay
    (:func:`slmserve.stats.repeats_inside`; ``None`` where the mean is at or past a bound);
    ``paired_vs`` holds the same pairing against every other client at the batch (``ratio``, ``n``, ``ci_lo``,
    ``ci_hi``, ``sd``, ``verdict``, ``equivalent``), on its window where it has one. ``host_link`` asks whether
    the runs' spread follows the host (:func:`host_link`), ``pair_link`` what the pairs' ratios follow, the
    server's latency or the host (:func:`pair_link`), ``server_side`` whether it is the server's speed
    (:func:`server_side`), ``load_side`` whether the clients kept the same load (:func:`load_side`),
    ``client_side`` how much of their requests' time was the client's own (:func:`client_side`), ``cpu_side``
    how busy each client's process and the server's were meanwhile (:func:`cpu_side`), ``equal_server`` the
    paired throughput ratio had the server been as fast for both runs of a repeat (:func:`equal_server`),
    ``between_sources`` whether pooled folders' pairs differ in mean ratio (:func:`between_sources`),
    ``across_sources`` the pooled ratio with machines as a random effect (:func:`across_sources`), and a pool's
    verdict, ``pool_verdict`` and ``pool_equivalent`` (:func:`pool_reading`: both readings must make the
    claim; ``all_pool_equivalent``, None without a pool). A run
    with throughput ``None`` (nothing completed) is left out of the means; ``all_ok`` says whether every
    request of every run of the client completed."""
    batches: list[dict[str, Any]] = []
    for batch in sorted({int(r["batch"]) for r in rows}):
        at = [r for r in rows if int(r["batch"]) == batch]
        clients: dict[str, dict[str, Any]] = {}
        for name in dict.fromkeys(str(r["client"]) for r in at):
            runs = sorted((r for r in at if r["client"] == name), key=lambda r: int(r["repeat"]))
            values = [float(r["throughput_rps"]) for r in runs if r["throughput_rps"] is not None]
            windows = [float(r["window_rps"]) for r in runs if r.get("window_rps") is not None]
            clients[name] = {
                "runs": len(runs),
                "throughput_rps": values,
                "mean_rps": statistics.fmean(values) if values else None,
                "sd_rps": statistics.stdev(values) if len(values) >= 2 else None,
                "cv": cv(values),
                "mean_window_rps": statistics.fmean(windows) if windows else None,
                "all_ok": all(int(r["ok"]) == int(r["n"]) for r in runs),
            }
        ratios = _ratios(clients, subject, "mean_rps")
        within = {k: _within(v, tolerance) for k, v in ratios.items()}
        window_ratios = _ratios(clients, subject, "mean_window_rps")
        # judged on one definition (first send to last end): vllm bench serve's own duration starts earlier
        key = "window_rps" if window_ratios.get(reference) is not None else "throughput_rps"
        ratio = window_ratios.get(reference)
        ratio = ratios.get(reference) if ratio is None else ratio
        ci = stats.ratio_ci(*(_values(at, name, key) for name in (subject, reference)))
        pairs = {name: _paired(at, subject, name, "window_rps" if window_ratios.get(name) is not None
                               else "throughput_rps") for name in clients if name != subject}  # fmt: skip
        paired = pairs.get(reference) or _paired(at, subject, reference, key)  # the same key: the rule above
        paired_vs = {name: {"ratio": pair["mean"], **{k: pair[k] for k in ("n", "ci_lo", "ci_hi", "sd")},
                            **_judgement("", pair, tolerance)} for name, pair in pairs.items()}  # fmt: skip
        batches.append(
            {
                "batch": batch,
                "n": max((int(r["n"]) for r in at), default=0),
                "clients": clients,
                "reference": reference,
                "ratio": ratio,
                "ratio_ci_lo": ci["ci_lo"],
                "ratio_ci_hi": ci["ci_hi"],
                **_judgement("", ci, tolerance),
                "within_tolerance": _within(ratio, tolerance),
                "paired_ratio": paired["mean"],
                "paired_n": paired["n"],
                "paired_ci_lo": paired["ci_lo"],
                "paired_ci_hi": paired["ci_hi"],
                "paired_sd": paired["sd"],
                "paired_n_needed": stats.repeats_for(paired["sd"], tolerance),
                "paired_n_inside": stats.repeats_inside(paired["mean"], paired["sd"], tolerance),
                **_judgement("paired_", paired, tolerance),
                "ratios": ratios,
                "within": within,
                "window_ratios": window_ratios,
                "paired_vs": paired_vs,
                "host_link": host_link(at),
                "pair_link": pair_link(at, subject),
                "server_side": server_side(at, subject),
                "load_side": load_side(at, subject),
                "client_side": client_side(at, subject),
                "cpu_side": cpu_side(at, subject),
                "equal_server": equal_server(at, subject, tolerance),
                "between_sources": between_sources(at, subject, reference, key),
                "across_sources": across_sources(at, subject, reference, key, tolerance),
            }
        )
        batches[-1].update(pool_reading(batches[-1]))
    pools = [b for b in batches if b["pool_verdict"] is not None]
    return {
        "subject": subject,
        "reference": reference,
        "tolerance": tolerance,
        "batches": batches,
        "all_within_tolerance": bool(batches) and all(b["within_tolerance"] for b in batches),
        "all_agree": bool(batches) and all(b["verdict"] == "agree" for b in batches),
        "all_equivalent": bool(batches) and all(b["equivalent"] for b in batches),
        "all_paired_equivalent": bool(batches) and all(b["paired_equivalent"] for b in batches),
        "all_pool_equivalent": all(b["pool_equivalent"] for b in pools) if pools else None,
    }


def rows_csv(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] = CSV_COLUMNS) -> str:
    buf = _io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: "" if r.get(k) is None else r[k] for k in columns})
    return buf.getvalue()


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``fidelity.csv`` (:func:`rows_csv`), numbers as numbers and empty fields as None."""
    ints = dict.fromkeys(("batch", "repeat", "n", "ok", "peak_inflight", "server_requests",
                          "server_measured_requests"), pl.Int64)  # fmt: skip
    floats = dict.fromkeys(("throughput_rps", "output_tok_s", "duration_s", "window_rps", "host_speed_ms",
                            "host_steal_frac", "server_e2e_s", "mean_inflight", "server_measured_e2e_s",
                            *CPU_READS),
                           pl.Float64)  # fmt: skip
    return pl.read_csv(path, schema_overrides={**ints, **floats, "client": pl.String, "error": pl.String}).to_dicts()


def write_outputs(
    out: Path, rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], columns: Sequence[str] = CSV_COLUMNS
) -> tuple[Path, Path]:
    """``out/fidelity.csv`` (one row per run, ``columns``) and ``out/fidelity.json`` (the summary), both atomic."""
    csv_path, json_path = out / "fidelity.csv", out / "fidelity.json"
    io.atomic_write_text(csv_path, rows_csv(rows, columns))
    io.atomic_write_text(json_path, json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
    return csv_path, json_path
