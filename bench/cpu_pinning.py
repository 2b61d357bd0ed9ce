"""Host CPU placement on a GPU: throughput with the server's and the client's processes on physical cores of
their own (:mod:`slmserve.pinning`) against the OS's placement, on one server.

    python bench/cpu_pinning.py run --model opt125m --prompts P --out DIR [--batches 64 512] [--repeats 5]
        [--per-role 2]
    python bench/cpu_pinning.py compare DIR     # here, on the results brought back

``run`` starts one server (the batch capped in the scheduler, ``--max-cudagraph-capture-size 512``) and
measures every batch ``pinned`` and ``unpinned``, the two alternating which goes first from one repeat to the
next. Before each run it sets the affinity of every thread of the server's processes and of the client: by
role (engine core, API server, client: ``--per-role`` physical cores each) or back to all the host's CPUs.
The placement and the host's cores are logged and written to ``DIR/<model>/placement.json``. 1500 requests per
run (``--requests``). Results: ``DIR/<model>/{pinned,unpinned}/bs<b>.{requests,telemetry}.parquet``.

``compare`` prints and writes ``DIR/compare.csv``: per batch, each setting's n, mean throughput with its 95%
CI and coefficient of variation, and the ratio pinned/unpinned with its 95% CI (:func:`slmserve.stats.ratio_ci`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench.batch_control import (
    alternate,
    cli,
    paired_columns,
    setting_outputs,
    setting_samples,
    shrunk,
    smoke_args,
    sweep_job,
    write_table,
)
from slmserve import pinning, runner, stats
from slmserve.server import VllmServer

log = logging.getLogger("cpu_pinning")
SETTINGS = ("pinned", "unpinned")


def jobs(args: argparse.Namespace) -> dict[str, runner.SweepJob]:
    """The two settings' jobs: the batch-control benchmark's scheduler job with pinned CUDA-graph sizes (its
    workload, unless the arguments shrink it for a CPU smoke run), the placement in ``extra``."""
    base = sweep_job(args.model, "scheduler", args.prompts, args.out, args.batches, repeats=1, graphs=args.graphs,
                     requests=args.requests)  # fmt: skip
    by = {}
    for name in SETTINGS:
        by[name] = shrunk(base, args, outputs=setting_outputs(args.out, args.model, name, args.batches),
                          extra={"cpu_placement": name})  # fmt: skip
    return by


def run(args: argparse.Namespace) -> None:
    cores = pinning.physical_cores()
    plan = pinning.plan(cores, args.per_role)
    everything = frozenset(c for core in cores for c in core)
    record = {"physical_cores": [list(c) for c in cores], "plan": plan.as_dict(), "pid": os.getpid()}
    log.info("host: %d physical cores %s; plan %s", len(cores), cores, plan.as_dict())
    args.out.joinpath(args.model).mkdir(parents=True, exist_ok=True)

    def place(setting: str, srv: VllmServer) -> None:
        assert srv.proc is not None
        counts = pinning.apply(srv.proc.pid, plan if setting == "pinned" else everything)
        record.setdefault("threads_set", []).append({"setting": setting, **counts})
        log.info("%s: threads set %s", setting, counts)

    try:
        alternate(jobs(args), args.batches, args.repeats, f"{args.model} cpu pinning", before=place)
    finally:
        os.sched_setaffinity(0, everything)
        (args.out / args.model / "placement.json").write_text(json.dumps(record, indent=1))


def compare(args: argparse.Namespace) -> pl.DataFrame:
    out = []
    for model, batch, by in setting_samples(args.out, SETTINGS):
        cv = {f"{s}_cv": (d["sd"] / d["mean"]) if d["sd"] is not None else None
              for s, d in ((s, stats.describe(xs)) for s, xs in by.items())}  # fmt: skip
        out.append({"model": model, "batch_size": batch, **paired_columns(by), **cv})
    return write_table(pl.DataFrame(out).sort("model", "batch_size"), args.out, precision=4)


def run_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("--batches", type=int, nargs="+", default=[64, 512])
    r.add_argument("--repeats", type=int, default=5)
    r.add_argument("--per-role", type=int, default=2, help="physical cores for each of engine, API server, client")
    r.add_argument("--graphs", type=int, default=512, help="--max-cudagraph-capture-size of the server")
    r.add_argument("--requests", type=int, default=1500, help="requests per run; the prompts file must hold them")
    smoke_args(r)


def main(argv: list[str] | None = None) -> int:
    return cli(__doc__, run_args, run, compare, argv)


if __name__ == "__main__":
    raise SystemExit(main())
