"""bench/rerun.py: one profile measured twice, compared point by point (the committed quick-opt1.3b runs)."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from bench import rerun
from slmserve import stats

ROOT = Path(__file__).resolve().parents[1]
A, B = ROOT / "results/quick-opt1.3b", ROOT / "results/quick-opt1.3b-rerun"
CSV = ROOT / "bench/results/rerun-quick-opt1.3b.csv"
CSV_H100 = ROOT / "bench/results/rerun-quick-h100-opt1.3b.csv"


def _summaries(a: Path, b: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Copies of two committed outdirs' summaries, or a skip where the checkout lacks them."""
    if not (a / "summary").exists() or not (b / "summary").exists():
        pytest.skip(f"the {a.name} and {b.name} results are not in this checkout")
    for src, dst in ((a, tmp_path / "a"), (b, tmp_path / "b")):
        shutil.copytree(src / "summary", dst / "summary")
    return tmp_path / "a", tmp_path / "b"


def _rerun_csv(outdirs: tuple[Path, Path], tmp_path: Path) -> str:
    """What ``bench/rerun.py A B --csv`` writes for two outdirs."""
    out = tmp_path / "t.csv"
    assert rerun.main([str(outdirs[0]), str(outdirs[1]), "--csv", str(out)]) == 0
    return out.read_text()


@pytest.fixture
def outdirs(tmp_path: Path) -> tuple[Path, Path]:
    return _summaries(A, B, tmp_path)


def test_every_point_of_both_runs_is_paired_with_its_ratio_and_verdict(outdirs: tuple[Path, Path]) -> None:
    table = rerun.compare(*outdirs)
    assert table.height == 13  # 10 batches, 3 replica counts
    for r in table.iter_rows(named=True):
        assert r["ratio"] == pytest.approx(r["b_throughput_rps"] / r["a_throughput_rps"])
        assert r["ratio_ci_lo"] < r["ratio"] < r["ratio_ci_hi"]
        assert r["verdict"] == stats.verdict(r["ratio_ci_lo"], r["ratio_ci_hi"], 0.03)
    assert table.filter(pl.col("point") == "opt1.3b tp1 b=256 out=256")["verdict"].item() == "differ"
    assert table.filter(pl.col("point") == "opt1.3b x3 b=170 equal together")["verdict"].item() == "agree"


def test_the_committed_table_is_what_the_results_give(outdirs: tuple[Path, Path], tmp_path: Path) -> None:
    """bench/results/rerun-quick-opt1.3b.csv, quoted in REPRODUCTION.md, is the script's output."""
    assert _rerun_csv(outdirs, tmp_path) == CSV.read_text()


def test_the_committed_h100_table_is_what_the_results_give(tmp_path: Path) -> None:
    """bench/results/rerun-quick-h100-opt1.3b.csv, quoted in REPRODUCTION.md: the quick profile's H100 run
    (2026-11-23) against config/quick-opt1.3b-h100.yaml's (2026-12-06), OPT-1.3B's equal splits and sweep paired,
    every other row listed as only in the first."""
    outdirs = _summaries(ROOT / "results/quick", ROOT / "results/quick-opt1.3b-h100", tmp_path)
    assert _rerun_csv(outdirs, tmp_path) == CSV_H100.read_text()
    table = pl.read_csv(CSV_H100)
    paired = table.filter(pl.col("verdict") != "only in A")
    assert paired.height == 13 and paired["ratio"].null_count() == 0  # 10 batches, 3 replica counts
    assert paired["point"].str.starts_with("opt1.3b").all()
    # the other models, and OPT-1.3B's advisor plans, which config/quick-opt1.3b-h100.yaml does not run
    assert table.height - paired.height == 32


def _sweep(batch: int, throughput: float | None, n: int, status: str = "ok", rate: float = float("inf")) -> dict:
    return {"model": "opt1.3b", "tp": 1, "batch_size": batch, "input_len": 512, "output_len": 256,
            "arrival_rate": rate, "status": status, "n_repeats": 3, "throughput_rps_n": n,
            "throughput_rps": throughput, "throughput_rps_sd": None if throughput is None else 0.005 * throughput,
            "throughput_rps_ci_lo": None, "throughput_rps_ci_hi": None, "sm_clock_mhz_mean": 1980.0,
            "gpu_util_mean": 90.0, "machines": "m"}  # fmt: skip


def _replication(replicas: int, throughput: float, budget: float | None) -> dict:
    row = _sweep(256, throughput, 3)
    for key in ("tp", "batch_size", "arrival_rate"):
        row.pop(key)
    return {**row, "replicas": replicas, "batch_per_replica": 256, "plan": "equal", "start": "together",
            "mps": False, "memory_budget_gb": budget}  # fmt: skip


def _write(outdir: Path, sweep: list[dict], replication: list[dict]) -> Path:
    (outdir / "summary").mkdir(parents=True)
    pl.DataFrame(sweep).write_parquet(outdir / "summary/sweep.parquet")
    pl.DataFrame(replication).write_parquet(outdir / "summary/replication.parquet")
    return outdir


def test_no_row_is_dropped_and_n_is_the_repeats_with_a_value(tmp_path: Path) -> None:
    a = _write(tmp_path / "a", [_sweep(1, 2.0, 3), _sweep(2, 4.0, 3), _sweep(4, None, 0, "infeasible"),
                                _sweep(16, 30.0, 1), _sweep(64, 50.0, 3, rate=2.0)],
               [_replication(1, 60.0, None)])  # every budget null: a Null column  # fmt: skip
    b = _write(tmp_path / "b", [_sweep(1, 2.2, 2), _sweep(4, None, 0, "infeasible"), _sweep(8, 14.0, 3),
                                _sweep(16, 31.0, 3), _sweep(64, 50.2, 3, rate=2.0)],
               [_replication(1, 61.0, None), _replication(1, 40.0, 36.0)])  # fmt: skip
    table = rerun.compare(a, b)
    by = {r["point"]: r for r in table.iter_rows(named=True)}
    assert table.height == 8 and len(by) == 8
    b1 = by["opt1.3b tp1 b=1 out=256"]
    expect = stats.ratio_ci_of({"n": 2, "mean": 2.2, "sd": 0.011}, {"n": 3, "mean": 2.0, "sd": 0.01})
    assert (b1["ratio_ci_lo"], b1["ratio_ci_hi"]) == pytest.approx((expect["ci_lo"], expect["ci_hi"]))  # not n_repeats
    assert by["opt1.3b tp1 b=2 out=256"]["verdict"] == "only in A"
    assert by["opt1.3b tp1 b=8 out=256"]["verdict"] == "only in B"
    assert by["opt1.3b tp1 b=4 out=256"]["verdict"] == "not measured in A (infeasible)"
    assert by["opt1.3b tp1 b=16 out=256"]["verdict"] == "inconclusive"  # one repeat in A: no interval
    assert by["opt1.3b tp1 b=64 out=256 rate=2"]["verdict"] == "agree"
    assert by["opt1.3b x1 b=256 equal together"]["ratio"] == pytest.approx(61 / 60)
    assert by["opt1.3b x1 b=256 equal together 36 GB"]["verdict"] == "only in B"


def test_a_missing_summary_names_the_file(outdirs: tuple[Path, Path]) -> None:
    a, b = outdirs
    (b / "summary/replication.parquet").unlink()
    with pytest.raises(SystemExit, match=r"replication\.parquet: no replication summary"):
        rerun.compare(a, b)
