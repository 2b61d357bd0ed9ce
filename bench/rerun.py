"""Run to run: one profile measured twice (two outdirs, each from its own machines), point by point.

    python bench/rerun.py OUTDIR_A OUTDIR_B [--csv PATH] [--tolerance 0.03]

Reads the sweep and replication summaries of both outdirs (``summary/{sweep,replication}.parquet``, as the
workflow writes them) and pairs their rows: a sweep point by model, tensor parallelism, batch, prompt and output
length and arrival rate; a replication run by model, replicas, batch per replica, plan, start, MPS, memory
budget and lengths. Per pair: each side's system throughput (req/s) with n (repeats with a value) and 95% CI,
the ratio of means B/A with its 95% CI (:func:`slmserve.stats.ratio_ci_of` from the summaries' n, mean and SD),
the verdict at ``--tolerance`` (:func:`slmserve.stats.verdict`), and beside them what can explain a difference:
each side's mean SM clock (MHz) and GPU utilisation (%) over the measured windows, and the machines that
measured it. No row is dropped: one of a single outdir has the verdict ``only in A`` (or ``B``), one that a
side holds unmeasured (infeasible, failed, not measured yet) ``not measured in A (<status>)``. Prints the
table and writes it as CSV where ``--csv`` says.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench.batch_control import AGREEMENT
from slmserve import stats
from slmserve.io import atomic_write_text

# every setting that makes two rows the same measurement: a replication run whose probe split the batch
# otherwise (batch_per_replica) is another run, listed on both sides rather than paired
KEYS = {
    "sweep": ("model", "tp", "batch_size", "input_len", "output_len", "arrival_rate"),
    "replication": ("model", "replicas", "batch_per_replica", "plan", "start", "mps", "memory_budget_gb",
                    "input_len", "output_len"),
}  # fmt: skip
SIDE = ("status", "throughput_rps_n", "throughput_rps", "throughput_rps_sd", "throughput_rps_ci_lo",
        "throughput_rps_ci_hi", "sm_clock_mhz_mean", "gpu_util_mean", "machines")  # fmt: skip


def summary(outdir: Path, experiment: str) -> pl.DataFrame:
    """``outdir``'s summary of ``experiment``; SystemExit naming the file if it is missing or lacks a column."""
    path = outdir / "summary" / f"{experiment}.parquet"
    if not path.exists():
        raise SystemExit(f"{path}: no {experiment} summary; build it with the profile's summary target first")
    frame = pl.read_parquet(path)
    missing = [c for c in (*KEYS[experiment], *SIDE) if c not in frame.columns]
    if missing:
        raise SystemExit(f"{path}: no column {', '.join(missing)}; re-plot it with this checkout (make replot)")
    return frame


def label(experiment: str, row: dict[str, Any]) -> str:
    """A point's name in the table: ``opt1.3b tp1 b=256 out=256`` or ``opt1.3b x2 b=256 equal together``."""
    if experiment == "sweep":
        rate = "" if row["arrival_rate"] in (None, float("inf")) else f" rate={row['arrival_rate']:g}"
        return f"{row['model']} tp{row['tp']} b={row['batch_size']} out={row['output_len']}{rate}"
    extra = " mps" if row["mps"] else ""
    budget = f" {row['memory_budget_gb']:g} GB" if row["memory_budget_gb"] is not None else ""
    return f"{row['model']} x{row['replicas']} b={row['batch_per_replica']} {row['plan']} {row['start']}{extra}{budget}"


def _verdict(r: dict[str, Any], ci: dict[str, Any], tolerance: float) -> str:
    if not (r["a_present"] and r["b_present"]):
        return "only in A" if r["a_present"] else "only in B"
    for side in ("a", "b"):
        if r[f"{side}_throughput_rps"] is None:
            return f"not measured in {side.upper()} ({r[f'{side}_status']})"
    return stats.verdict(ci["ci_lo"], ci["ci_hi"], tolerance)


def pair(experiment: str, a: pl.DataFrame, b: pl.DataFrame, tolerance: float) -> list[dict[str, Any]]:
    """One row per row of ``a`` or ``b`` (module docstring)."""
    keys = list(KEYS[experiment])
    # a key all null in one summary (e.g. no memory budget) is typed Null there: join on the common types
    schema = pl.concat([a.select(keys), b.select(keys)], how="vertical_relaxed").schema
    sides = [f.select(*keys, *SIDE, present=pl.lit(True)).cast(dict(schema))
             .rename({c: f"{s}_{c}" for c in (*SIDE, "present")}) for f, s in ((a, "a"), (b, "b"))]  # fmt: skip
    joined = sides[0].join(sides[1], on=keys, how="full", coalesce=True, nulls_equal=True)
    rows = []
    for r in joined.sort(keys).iter_rows(named=True):
        da, db = (stats.summary_sample({c: r[f"{s}_{c}"] for c in SIDE}) for s in ("a", "b"))
        ci = stats.ratio_ci_of(db, da)
        rows.append({"experiment": experiment, "point": label(experiment, r),
                     **{f"{s}_{c}": r[f"{s}_{c}"] for s in ("a", "b") for c in SIDE},
                     "ratio": ci["ratio"], "ratio_ci_lo": ci["ci_lo"], "ratio_ci_hi": ci["ci_hi"],
                     "verdict": _verdict(r, ci, tolerance)})  # fmt: skip
    return rows


def compare(a: Path, b: Path, tolerance: float = AGREEMENT) -> pl.DataFrame:
    """The table of the module docstring for outdirs ``a`` and ``b``."""
    rows = [row for exp in KEYS for row in pair(exp, summary(a, exp), summary(b, exp), tolerance)]
    return pl.DataFrame(rows, infer_schema_length=None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path, help="outdir of the first run (the reference: ratios are B/A)")
    ap.add_argument("b", type=Path, help="outdir of the second run")
    ap.add_argument("--csv", type=Path, help="write the table here")
    ap.add_argument("--tolerance", type=float, default=AGREEMENT, help="agreement tolerance of the verdict")
    args = ap.parse_args(argv)
    table = compare(args.a, args.b, args.tolerance)
    if args.csv:
        atomic_write_text(args.csv, table.write_csv(float_precision=4))
    shown = table.select("point", *(f"{s}_{c}" for s in "ab" for c in ("throughput_rps_n", "throughput_rps")),
                         "ratio", "ratio_ci_lo", "ratio_ci_hi", "verdict",
                         *(f"{s}_{c}" for c in ("sm_clock_mhz_mean", "gpu_util_mean") for s in "ab"))  # fmt: skip
    with pl.Config(tbl_rows=100, tbl_cols=20, tbl_width_chars=240, float_precision=3):
        print(shown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
