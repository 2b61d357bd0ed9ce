"""bench/gpu_dag.sh: its stages, the NO_START_AFTER guard, FRESH and what a call packs, with a stand-in for
Snakemake (a ``snakemake`` module that records its arguments; no device, no workflow run)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, committed_repo

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or shutil.which("setsid") is None, reason="needs git and setsid"
)

# Stand-in for `python3 -m snakemake`: records its arguments, writes a result and a data file into the outdir.
STAND_IN = """
import json, sys, yaml
from pathlib import Path
args = sys.argv[1:]
outdir = yaml.safe_load(open(args[args.index("--configfile") + 1]))["outdir"]
with open("calls.jsonl", "a") as f:
    f.write(json.dumps(args) + "\\n")
Path(outdir, "made").mkdir(parents=True, exist_ok=True)
Path(outdir, "made", args[-1]).write_text("measured")
Path(outdir, "data", "built.parquet").write_text("prompts built by the run")
"""


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    """A sent tree (two configs, a committed result), the carry, Snakemake's install dir and $OUT."""
    repo = committed_repo(tmp_path / "repo", {"Snakefile": "", "config/a.yaml": "outdir: results/a\n",
                          "config/b.yaml": "outdir: results/b\n", "results/a/done.parquet": "committed"})  # fmt: skip
    carry = tmp_path / "carry"
    (carry / "extra").mkdir(parents=True)
    (carry / "extra/prompts-in8-n4.parquet").write_text("prompts")
    site = tmp_path / "site"
    (site / "polars").mkdir(parents=True)
    (site / "snakemake").mkdir()
    (site / "snakemake/__main__.py").write_text(STAND_IN)
    bin_dir = tmp_path / "bin"  # python3 with pyyaml, as on the hosts
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    return {"repo": repo, "carry": carry, "site": site, "wf": tmp_path / "wf", "out": tmp_path / "out",
            "bin": bin_dir}  # fmt: skip


def _call(host: dict[str, Path], *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    shutil.rmtree(host["out"], ignore_errors=True)
    host["out"].mkdir()
    env = {**os.environ, "PATH": f"{host['bin']}{os.pathsep}{os.environ['PATH']}", "GPU_WF": str(host["wf"]),
           "GPU_SITE": str(host["site"]), "GPU_CARRY": str(host["carry"]), "OUT": str(host["out"]), "GPUS": "2",
           **env}  # fmt: skip
    done = subprocess.run(["bash", str(ROOT / "bench/gpu_dag.sh"), *args], cwd=host["repo"], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _calls(host: dict[str, Path]) -> list[list[str]]:
    path = host["wf"] / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _packed(host: dict[str, Path]) -> set[str]:
    with tarfile.open(host["out"] / "results.tgz") as tgz:
        return set(tgz.getnames())


def test_stages_run_in_order_with_their_configs_and_a_call_packs_only_what_it_made(host: dict[str, Path]) -> None:
    done = _call(host, "config/a.yaml", "60", "t1", "+", "config/b.yaml", "t2", "t3")
    assert "FINISHED" in done.stdout
    first, second = _calls(host)
    assert first[:2] == ["--configfile", "config/a.yaml"] and first[-1] == "t1"
    assert second[:2] == ["--configfile", "config/b.yaml"] and second[-2:] == ["t2", "t3"]
    assert "gpu=2" in first and "--rerun-incomplete" in first  # GPUS sets --resources
    log = (host["wf"] / "snakemake.log").read_text()
    assert "snakemake exit 0 (config/a.yaml t1)" in log and "snakemake exit 0 (config/b.yaml t2 t3)" in log
    assert (host["wf"] / "results/b/data/prompts-in8-n4.parquet").exists()  # the prompts in every outdir
    # the results this machine wrote come back; the committed result and the prompts do not
    assert {"results/a/made/t1", "results/b/made/t3", "snakemake.log", ".started"} <= _packed(host)
    assert not {
        "results/a/done.parquet",
        "results/a/data/prompts-in8-n4.parquet",
        "results/a/data/built.parquet",
    } & _packed(host)  # data/ stays: prompts are rebuilt or carried, never measured
    # a later call waits on the same run and packs again; it starts nothing
    assert "FINISHED" in _call(host, "config/a.yaml", "5").stdout
    assert len(_calls(host)) == 2 and "results/b/made/t3" in _packed(host)


def test_no_stage_starts_past_no_start_after(host: dict[str, Path]) -> None:
    _call(host, "config/a.yaml", "60", "t1", "+", "config/b.yaml", "t2", NO_START_AFTER="1")
    assert _calls(host) == []
    log = (host["wf"] / "snakemake.log").read_text()
    assert "stage not started: past NO_START_AFTER (config/a.yaml t1)" in log
    assert "stage not started: past NO_START_AFTER (config/b.yaml t2)" in log


def test_a_guard_in_the_future_starts_every_stage(host: dict[str, Path]) -> None:
    _call(host, "config/a.yaml", "60", "t1", "+", "config/b.yaml", "t2", NO_START_AFTER="99999999999")
    assert [c[-1] for c in _calls(host)] == ["t1", "t2"]
    assert "stage not started" not in (host["wf"] / "snakemake.log").read_text()


def test_fresh_removes_a_committed_result_before_the_run(host: dict[str, Path]) -> None:
    done = _call(host, "config/a.yaml", "60", "t1", FRESH="results/a/done.parquet")
    assert "removed results/a/done.parquet (FRESH)" in done.stdout
    assert not (host["wf"] / "results/a/done.parquet").exists()
    assert (host["repo"] / "results/a/done.parquet").exists()  # the sent tree keeps it
