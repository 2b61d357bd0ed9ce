"""Batch control on a GPU: the scheduler cap (one start) against restarts with ``--max-num-seqs b``.

    python bench/batch_control.py run --model opt125m --prompts P --out DIR [--modes scheduler restart]
        [--batches 1 8 64 256 512] [--repeats 3]
    python bench/batch_control.py compare DIR      # here, on the results brought back

``run`` measures each mode with the workflow's own code (:func:`slmserve.runner.run_sweep`): ``scheduler``
starts one server (``--max-num-seqs`` = the largest batch) and repeats the batch sizes interleaved;
``restart`` starts one server per batch size and repeats each on it. 500 requests per point
(``--requests``), except small batches: 64 rounds of the batch (``--rounds``; a 500-request run at batch 1
takes minutes; stated in the output). Results:
``DIR/<model>/<mode>/bs<b>.{requests,telemetry}.parquet`` with provenance, as the workflow writes them.

``compare`` prints, per model, restart variant (``restart``, or ``restart-graphs<N>`` measured with
``--graphs N`` = ``--max-cudagraph-capture-size`` on every server) and batch, each mode's mean throughput
(req/s) with n and its 95% CI, and the ratio scheduler/restart with its 95% CI
(:func:`slmserve.stats.ratio_ci`), and the verdict of that CI at 3% (:func:`slmserve.stats.verdict`: the
modes agree where it contains 1 and its half-width is at most 3%, differ where it excludes 1, and the
repeats cannot tell otherwise). It writes ``DIR/compare.csv``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from slmserve import analysis, runner, stats

AGREEMENT = 0.03  # issue 13: the modes agree when the ratio's CI contains 1 within +-3%
MODELS = {"opt125m": "config/models/opt-125m", "opt1.3b": "config/models/opt-1.3b", "opt2.7b": "config/models/opt-2.7b"}


def sweep_job(model: str, mode: str, prompts: Path, out: Path, batches: list[int], repeats: int,
              graphs: int | None = None, requests: int = 500, rounds: int = 64) -> runner.SweepJob:  # fmt: skip
    base = out / model / (mode if graphs is None else f"{mode}-graphs{graphs}")
    return runner.SweepJob(
        model=model, model_path=MODELS[model], load_format="dummy", tensor_parallel=1, batch_sizes=batches,
        prompts_path=prompts, outputs={b: (base / f"bs{b}.requests.parquet", base / f"bs{b}.telemetry.parquet")
                                       for b in batches},
        log_dir=out / "logs" / model / mode, input_len=512, output_len=256, num_requests=requests,
        rounds_per_batch=rounds, min_requests=rounds, warmup_requests=8, batch_control=mode, repeats=repeats,
        stream_interval=16, profile="bench-batch-control", max_cudagraph_capture_size=graphs,
    )  # fmt: skip


def run(args: argparse.Namespace) -> None:
    for mode in args.modes:
        job = sweep_job(args.model, mode, args.prompts, args.out, args.batches, args.repeats, args.graphs,
                        args.requests, args.rounds)  # fmt: skip
        if all(paths[0].exists() for paths in job.outputs.values()):
            print(f"== {args.model} {mode}: already measured", flush=True)
            continue
        runner.run_sweep(job)
        print(f"== {args.model} {mode}: done", flush=True)


def repeat_throughputs(out: Path, level: str) -> pl.DataFrame:
    """One row per measured repeat of every ``out/<model>/<level>/bs<b>.requests.parquet`` (its summary,
    :func:`slmserve.analysis.summarize_repeats`, with ``path``)."""
    paths = sorted(str(p) for p in out.glob("*/*/bs*.requests.parquet"))
    if not paths:
        raise SystemExit(f"{out}: no */<{level}>/bs*.requests.parquet here; run `run` first")
    rows = pl.DataFrame([r for p in paths for r in analysis.summarize_repeats(p)], infer_schema_length=None)
    return rows.filter(pl.col("status") == "ok")


def paired_columns(by: dict[str, list[float]]) -> dict[str, Any]:
    """For two named samples of throughput (first / second): each one's n, mean and 95% CI, and the ratio
    of their means with its 95% CI (:func:`slmserve.stats.ratio_ci`)."""
    row: dict[str, Any] = {}
    for name, xs in by.items():
        d = stats.describe(xs)
        row.update({f"{name}_n": d["n"], f"{name}_mean": d["mean"], f"{name}_ci_lo": d["ci_lo"],
                    f"{name}_ci_hi": d["ci_hi"]})  # fmt: skip
    r = stats.ratio_ci(*by.values())
    return {**row, "ratio": r["ratio"], "ratio_ci_lo": r["ci_lo"], "ratio_ci_hi": r["ci_hi"]}


def write_table(frame: pl.DataFrame, out: Path, precision: int) -> pl.DataFrame:
    """Write ``frame`` as ``out/compare.csv``, print it and return it."""
    frame.write_csv(out / "compare.csv")
    with pl.Config(tbl_rows=50, tbl_cols=20, tbl_width_chars=220, float_precision=precision):
        print(frame)
    return frame


def compare(args: argparse.Namespace) -> pl.DataFrame:
    rows = repeat_throughputs(args.out, "mode").with_columns(
        mode=pl.col("path").str.extract(r"/(scheduler|restart|client)[^/]*/bs"),
        variant=pl.col("path").str.extract(r"/(restart[^/]*)/bs"),
    )
    out = []
    sched = rows.filter(pl.col("path").str.contains("/scheduler/"))  # the plain scheduler runs, no variant
    for (model, variant, batch), g in rows.filter(pl.col("mode") == "restart").group_by(
        "model", "variant", "batch_size", maintain_order=True
    ):
        ref = sched.filter(pl.col("model") == model, pl.col("batch_size") == batch)
        row = paired_columns({"scheduler": ref["throughput_rps"].to_list(), "restart": g["throughput_rps"].to_list()})
        verdict = stats.verdict(row["ratio_ci_lo"], row["ratio_ci_hi"], AGREEMENT)
        out.append({"model": model, "restart": variant, "batch_size": batch, **row, "verdict": verdict})
    return write_table(pl.DataFrame(out).sort("model", "restart", "batch_size"), args.out, precision=3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", required=True, choices=sorted(MODELS))
    r.add_argument("--prompts", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--modes", nargs="+", default=["scheduler", "restart"], choices=runner.MODES)
    r.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256, 512])
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--graphs", type=int, default=None, help="--max-cudagraph-capture-size of every server")
    r.add_argument("--requests", type=int, default=500,
                   help="requests per point (batch 1: 64); the prompts file must hold that many")  # fmt: skip
    r.add_argument("--rounds", type=int, default=64,
                   help="small batches measure max(rounds, rounds x batch) requests, at most --requests")  # fmt: skip
    c = sub.add_parser("compare")
    c.add_argument("out", type=Path)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(args) if args.cmd == "run" else compare(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
