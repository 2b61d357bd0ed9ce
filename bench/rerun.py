"""Run to run: one profile measured twice (two outdirs, each from its own machines), point by point.

    python bench/rerun.py OUTDIR_A OUTDIR_B [--csv PATH] [--tolerance 0.03]

Reads the sweep and replication summaries of both outdirs (``summary/{sweep,replication}.parquet``, as the
workflow writes them) and pairs their points: a sweep point by model, tensor parallelism, batch, output length
and arrival rate; a replication run by model, replicas, plan, start, MPS and memory budget. Per pair: each
side's system throughput (req/s) with n and 95% CI, the ratio of means B/A with its 95% CI
(:func:`slmserve.stats.ratio_ci_of` from the summaries' n, mean and SD), the verdict at ``--tolerance``
(:func:`slmserve.stats.verdict`), and beside them what can explain a difference: each side's mean SM clock
(MHz) and GPU utilisation (%) over the measured windows, and the machines that measured it. A point measured
in one outdir only is listed with ``verdict`` ``only in A`` (or ``B``), never dropped. Prints the table and
writes it as CSV where ``--csv`` says.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from slmserve import stats
from slmserve.io import atomic_write_text

TOLERANCE = 0.03  # issue 13's agreement rule: the CI contains 1 and its half-width is at most 3%
KEYS = {
    "sweep": ("model", "tp", "batch_size", "output_len", "arrival_rate"),
    "replication": ("model", "replicas", "plan", "start", "mps", "memory_budget_gb"),
}
SIDE = ("n_repeats", "throughput_rps", "throughput_rps_sd", "throughput_rps_ci_lo", "throughput_rps_ci_hi",
        "sm_clock_mhz_mean", "gpu_util_mean", "machines")  # fmt: skip


def summary(outdir: Path, experiment: str) -> pl.DataFrame:
    """The measured points of ``outdir``'s summary of ``experiment``; SystemExit naming the file if it is missing."""
    path = outdir / "summary" / f"{experiment}.parquet"
    if not path.exists():
        raise SystemExit(f"{path}: no {experiment} summary; build it with the profile's summary target first")
    frame = pl.read_parquet(path)
    return frame.filter(pl.col("throughput_rps").is_not_null()) if "throughput_rps" in frame.columns else frame


def label(experiment: str, row: dict[str, Any]) -> str:
    """A point's name in the table: ``opt1.3b tp1 b=256`` or ``opt1.3b x2 equal together``."""
    if experiment == "sweep":
        rate = "" if row["arrival_rate"] in (None, float("inf")) else f" rate={row['arrival_rate']:g}"
        return f"{row['model']} tp{row['tp']} b={row['batch_size']} out={row['output_len']}{rate}"
    extra = " mps" if row["mps"] else ""
    budget = f" {row['memory_budget_gb']:g} GB" if row["memory_budget_gb"] is not None else ""
    return f"{row['model']} x{row['replicas']} {row['plan']} {row['start']}{extra}{budget}"


def pair(experiment: str, a: pl.DataFrame, b: pl.DataFrame, tolerance: float) -> list[dict[str, Any]]:
    """One row per point of ``a`` or ``b`` (module docstring)."""
    keys = KEYS[experiment]
    sides = [f.select(*keys, *SIDE).rename({c: f"{s}_{c}" for c in SIDE}) for f, s in ((a, "a"), (b, "b"))]
    joined = sides[0].join(sides[1], on=list(keys), how="full", coalesce=True, nulls_equal=True)
    rows = []
    for r in joined.sort(*keys).iter_rows(named=True):
        da, db = ({"n": r[f"{s}_n_repeats"], "mean": r[f"{s}_throughput_rps"], "sd": r[f"{s}_throughput_rps_sd"]}
                  for s in ("a", "b"))  # fmt: skip
        if da["n"] is None or db["n"] is None:
            ci = {"ratio": None, "ci_lo": None, "ci_hi": None}
            verdict = "only in B" if da["n"] is None else "only in A"
        else:
            ci = stats.ratio_ci_of(db, da)
            verdict = stats.verdict(ci["ci_lo"], ci["ci_hi"], tolerance)
        rows.append({"experiment": experiment, "point": label(experiment, r),
                     **{f"{s}_{c}": r[f"{s}_{c}"] for s in ("a", "b") for c in SIDE},
                     "ratio": ci["ratio"], "ratio_ci_lo": ci["ci_lo"], "ratio_ci_hi": ci["ci_hi"],
                     "verdict": verdict})  # fmt: skip
    return rows


def compare(a: Path, b: Path, tolerance: float = TOLERANCE) -> pl.DataFrame:
    """The table of the module docstring for outdirs ``a`` and ``b``."""
    rows = [row for exp in KEYS for row in pair(exp, summary(a, exp), summary(b, exp), tolerance)]
    return pl.DataFrame(rows, infer_schema_length=None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path, help="outdir of the first run (the reference: ratios are B/A)")
    ap.add_argument("b", type=Path, help="outdir of the second run")
    ap.add_argument("--csv", type=Path, help="write the table here")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE, help="agreement tolerance of the verdict")
    args = ap.parse_args(argv)
    table = compare(args.a, args.b, args.tolerance)
    if args.csv:
        atomic_write_text(args.csv, table.write_csv(float_precision=4))
    shown = table.select("point", "a_n_repeats", "a_throughput_rps", "b_n_repeats", "b_throughput_rps", "ratio",
                         "ratio_ci_lo", "ratio_ci_hi", "verdict", "a_sm_clock_mhz_mean", "b_sm_clock_mhz_mean",
                         "a_gpu_util_mean", "b_gpu_util_mean")  # fmt: skip
    with pl.Config(tbl_rows=100, tbl_cols=20, tbl_width_chars=240, float_precision=3):
        print(shown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
