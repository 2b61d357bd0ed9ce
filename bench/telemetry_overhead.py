"""Telemetry overhead on a GPU: throughput with the sampler at its interval against without it, one server.

    python bench/telemetry_overhead.py run --model opt125m --prompts P --out DIR [--batches 64 512]
        [--repeats 5] [--interval-ms 100]
    python bench/telemetry_overhead.py compare DIR     # here, on the results brought back
    python bench/telemetry_overhead.py compare DIR --log DIR/bench.log   # from the run's log lines

``run`` starts one server (``--max-num-seqs`` = the largest batch, the batch capped in the scheduler) and
measures every batch with the sampler on and off through the workflow's measuring core
(:func:`slmserve.measure.measure`), the two alternating which goes first from one repeat to the next so
that drift falls on both. 500 requests per run. Results, as the workflow writes them:
``DIR/<model>/{sampler,nosampler}/bs<b>.{requests,telemetry}.parquet``.

``compare`` prints and writes ``DIR/compare.csv``: per batch, each setting's mean throughput (req/s) with n
and 95% CI, the ratio sampler/no sampler with its 95% CI (:func:`slmserve.stats.ratio_ci`), and the loss
bound ``1 - ci_lo``; the goal (at most 1% lost) is met where that bound is at most 1%. With ``--log``, the
throughputs come from ``run``'s log (:func:`bench.batch_control.log_samples`), for runs whose files were lost.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench.batch_control import (
    alternate,
    cli,
    log_samples,
    paired_columns,
    setting_outputs,
    setting_samples,
    shrunk,
    smoke_args,
    sweep_job,
    write_table,
)
from slmserve import runner

GOAL = 0.01  # issue 13: the sampler may cost at most 1% of throughput
SETTINGS = ("sampler", "nosampler")


def jobs(args: argparse.Namespace) -> dict[str, runner.SweepJob]:
    """The two settings' jobs: the batch-control benchmark's scheduler job (its workload, unless the
    arguments shrink it for a CPU smoke run), sampler on or off."""
    base = sweep_job(args.model, "scheduler", args.prompts, args.out, args.batches, repeats=1)
    requests = {"num_requests": args.requests} if args.requests else {}
    return {name: shrunk(base, args, **requests, outputs=setting_outputs(args.out, args.model, name, args.batches),
                         telemetry_enabled=name == "sampler", telemetry_interval_s=args.interval_ms / 1000)
            for name in SETTINGS}  # fmt: skip


def run(args: argparse.Namespace) -> None:
    alternate(jobs(args), args.batches, args.repeats, f"{args.model} telemetry overhead")


def compare(args: argparse.Namespace) -> pl.DataFrame:
    out = []
    log_path = getattr(args, "log", None)
    samples = log_samples(log_path, SETTINGS) if log_path else setting_samples(args.out, SETTINGS)
    for model, batch, by in samples:
        row = {"model": model, "batch_size": batch, **paired_columns(by)}
        loss = None if row["ratio_ci_lo"] is None else 1 - row["ratio_ci_lo"]
        out.append({**row, "loss_bound": loss, "goal_met": loss is not None and loss <= GOAL})
    return write_table(pl.DataFrame(out).sort("model", "batch_size"), args.out, precision=4)


def run_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("--batches", type=int, nargs="+", default=[64, 512])
    r.add_argument("--repeats", type=int, default=5)
    r.add_argument("--interval-ms", type=float, default=100.0, help="the sampler's interval (the workflow's)")
    r.add_argument("--requests", type=int, default=None, help="requests per run (default 500; CPU smoke runs)")
    smoke_args(r)


def compare_args(c: argparse.ArgumentParser) -> None:
    c.add_argument("--log", type=Path, default=None, help="read the runs from this log of `run` (bench.log)")


def main(argv: list[str] | None = None) -> int:
    return cli(__doc__, run_args, run, compare, argv, compare_args)


if __name__ == "__main__":
    raise SystemExit(main())
