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


@pytest.fixture
def outdirs(tmp_path: Path) -> tuple[Path, Path]:
    if not (A / "summary").exists() or not (B / "summary").exists():
        pytest.skip("the quick-opt1.3b results are not in this checkout")
    for src, dst in ((A, tmp_path / "a"), (B, tmp_path / "b")):
        shutil.copytree(src / "summary", dst / "summary")
    return tmp_path / "a", tmp_path / "b"


def test_every_point_of_both_runs_is_paired_with_its_ratio_and_verdict(outdirs: tuple[Path, Path]) -> None:
    table = rerun.compare(*outdirs)
    assert table.height == 13  # 10 batches, 3 replica counts
    for r in table.iter_rows(named=True):
        assert r["ratio"] == pytest.approx(r["b_throughput_rps"] / r["a_throughput_rps"])
        assert r["ratio_ci_lo"] < r["ratio"] < r["ratio_ci_hi"]
        assert r["verdict"] == stats.verdict(r["ratio_ci_lo"], r["ratio_ci_hi"], rerun.TOLERANCE)
    assert table.filter(pl.col("point") == "opt1.3b tp1 b=256 out=256")["verdict"].item() == "differ"
    assert table.filter(pl.col("point") == "opt1.3b x3 equal together")["verdict"].item() == "agree"


def test_the_committed_table_is_what_the_results_give(outdirs: tuple[Path, Path], tmp_path: Path) -> None:
    """bench/results/rerun-quick-opt1.3b.csv, quoted in REPRODUCTION.md, is the script's output."""
    out = tmp_path / "t.csv"
    assert rerun.main([str(outdirs[0]), str(outdirs[1]), "--csv", str(out)]) == 0
    assert out.read_text() == CSV.read_text()


def test_a_point_of_one_run_only_is_listed_not_dropped(outdirs: tuple[Path, Path]) -> None:
    a, b = outdirs
    sweep = b / "summary/sweep.parquet"
    pl.read_parquet(sweep).filter(pl.col("batch_size") != 8).write_parquet(sweep)
    table = rerun.compare(a, b)
    only = table.filter(pl.col("verdict") == "only in A")
    assert only["point"].to_list() == ["opt1.3b tp1 b=8 out=256"] and only["ratio"].to_list() == [None]
    assert table.height == 13


def test_a_missing_summary_names_the_file(outdirs: tuple[Path, Path]) -> None:
    a, b = outdirs
    (b / "summary/replication.parquet").unlink()
    with pytest.raises(SystemExit, match=r"replication\.parquet: no replication summary"):
        rerun.compare(a, b)
