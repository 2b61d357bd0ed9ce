"""Shared test fixtures: the repository root, the venv's snakemake, and a check for a real engine."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def have_engine() -> bool:
    return importlib.util.find_spec("vllm") is not None


requires_engine = pytest.mark.skipif(
    not have_engine(), reason="no vLLM engine importable: run `make test`, which installs it"
)


def snakemake(*args: str, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the venv's snakemake on this workflow; returns the completed process (output captured)."""
    exe = SNAKEMAKE if Path(SNAKEMAKE).exists() else shutil.which("snakemake")
    assert exe, "snakemake not found"
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run git in ``repo`` with a fixed identity (a temporary repository has none); output captured."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=check)


def committed_repo(repo: Path, files: dict[str, str]) -> Path:
    """``repo`` made a git repository holding ``files`` (path -> text) and what it held already, committed."""
    for f, text in files.items():
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        (repo / f).write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "tree")
    return repo


@pytest.fixture
def root() -> Path:
    return ROOT
