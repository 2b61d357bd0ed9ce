"""GPU time of a campaign from Snakemake's logs: per measuring rule and what it is drawn into.

python bench/campaign_cost.py .snakemake/log/*.snakemake.log [--csv jobs.csv]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl

# Run as a script: make the package and `bench` importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench import cost
from slmserve.io import atomic_write_text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", type=Path, help="Snakemake log files (.snakemake/log/*.snakemake.log)")
    ap.add_argument("--csv", type=Path, help="write one row per job here")
    args = ap.parse_args()
    jobs = pl.concat([cost.parse_log(p.read_text().splitlines(), str(p)) for p in args.logs])
    if args.csv:
        atomic_write_text(args.csv, jobs.write_csv())
    gpu = cost.by_figure(jobs)
    print(cost.markdown(gpu))
    print(f"GPU jobs: {int(gpu['finished'].sum())} finished, {int(gpu['unfinished'].sum())} unfinished; "
          f"{gpu['seconds'].sum() / 60:.1f} min of finished GPU jobs; wall (per log, first start to last end, "
          f"summed over {len(args.logs)} log(s)): {cost.wall_seconds(jobs) / 60:.1f} min")  # fmt: skip


if __name__ == "__main__":
    main()
