"""Merge a device call's results.tgz into the checkout and keep that machine's logs (bench/device_import.py).

python bench/gpu_import.py /work/.device/<n>/results.tgz h200x2-m47 [--fresh results/tp2/runs/opt125m]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Run as a script: make the package and `bench` importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench import device_import

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("archive", type=Path, help="the results.tgz of gpu_dag.sh's latest call (it is cumulative)")
    ap.add_argument("name", help="this machine's logs folder under bench/results/, e.g. h200x2-m47")
    ap.add_argument("--fresh", nargs="*", default=[], help="the paths the call gave gpu_dag.sh in FRESH (removed)")
    ap.add_argument("--repo", type=Path, default=ROOT, help="the checkout (default: this one)")
    args = ap.parse_args()
    try:
        done = device_import.import_archive(
            args.archive, args.repo, args.repo / "bench/results" / args.name, args.fresh
        )
    except (OSError, ValueError) as e:
        sys.exit(f"gpu_import: {e}")
    print(
        f"{len(done.results)} result files into the tree; {len(done.saved)} saved repeats (.partial/, untracked: "
        f"they travel with the next call); saved repeats deleted for {len(done.discarded)} points whose result came"
    )
    for rel in done.discarded:
        print(f"  done: {rel}")
    print("logs: " + ", ".join(done.logs))


if __name__ == "__main__":
    main()
