"""bench/gpu_tree.sh: a slim tree for device calls, in a git repository of its own (no device needed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, committed_repo, git

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _tree(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(["bash", "bench/gpu_tree.sh", *args], cwd=repo, env=env, capture_output=True, text=True)


def _repo(tmp_path: Path, files: list[str]) -> Path:
    """A git repository holding the script, the configs and ``files`` (each holding its own path), committed."""
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    shutil.copy(ROOT / "bench/gpu_tree.sh", repo / "bench/gpu_tree.sh")
    shutil.copytree(ROOT / "config", repo / "config", ignore=shutil.ignore_patterns("models", "schemas"))
    return committed_repo(repo, {f: f for f in files})


def test_slim_leaves_out_what_no_gpu_job_reads_and_restore_puts_it_back(tmp_path: Path) -> None:
    files = ["bench/results/log.txt", "paper_figures/fig.md", "results/runs/a.parquet", "results/quick/q.parquet",
             "results/tp2/t.parquet", "src/code.py"]  # fmt: skip
    repo = _repo(tmp_path, files)
    typo = _tree(repo, "slim", "config/confg.yaml")  # a mistyped config changes nothing
    assert typo.returncode == 2 and "no config file config/confg.yaml" in typo.stderr
    assert _tree(repo, "status").stdout.startswith("whole") and git(repo, "status", "--porcelain").stdout == ""
    (repo / "src/code.py").unlink()  # a tracked file gone from the work tree does not fail the script
    slim = _tree(repo, "slim", "config/config.yaml", "config/quick.yaml")
    assert slim.returncode == 0, slim.stderr
    tracked = set(git(repo, "ls-files").stdout.split())
    assert {"results/runs/a.parquet", "results/quick/q.parquet", "src/code.py"} <= tracked  # the outdirs measured
    assert not tracked & {"bench/results/log.txt", "paper_figures/fig.md", "results/tp2/t.parquet"}
    assert git(repo, "status", "--porcelain", "--untracked-files=all").stdout.count("??") == 0  # ignored too
    assert all((repo / f).exists() for f in files if f != "src/code.py")  # out of the index only
    assert _tree(repo, "status").stdout.startswith("slim")
    assert _tree(repo, "slim", "config/config.yaml").returncode == 2  # not twice
    refused = git(repo, "commit", "-qm", "would delete them", check=False)
    assert refused.returncode != 0 and "bench/gpu_tree.sh restore" in refused.stderr
    assert _tree(repo, "restore").returncode == 0
    assert set(git(repo, "ls-files").stdout.split()) == set(files) | {
        str(p.relative_to(repo)) for p in (repo / "config").glob("*.yaml")} | {"bench/gpu_tree.sh"}  # fmt: skip
    assert git(repo, "status", "--porcelain").stdout == " D src/code.py\n"
    assert _tree(repo, "status").stdout.startswith("whole")
    assert not (repo / ".git/hooks/pre-commit").exists()


def test_slim_of_a_profile_inside_the_paper_outdir_leaves_out_the_paper_results_beside_it(tmp_path: Path) -> None:
    files = ["results/runs/a.parquet", "results/calibration/c.parquet", "results/quick-tp/k.parquet",
             "results/quick/q.parquet", "src/code.py"]  # fmt: skip
    repo = _repo(tmp_path, files)
    slim = _tree(repo, "slim", "config/quick-tp.yaml")  # its outdir, results/quick-tp, is inside results
    assert slim.returncode == 0, slim.stderr
    tracked = set(git(repo, "ls-files").stdout.split())
    assert {"results/quick-tp/k.parquet", "src/code.py"} <= tracked
    assert not tracked & {"results/runs/a.parquet", "results/calibration/c.parquet", "results/quick/q.parquet"}
    assert git(repo, "status", "--porcelain", "--untracked-files=all").stdout.count("??") == 0
    assert _tree(repo, "restore").returncode == 0
    assert set(files) <= set(git(repo, "ls-files").stdout.split())
