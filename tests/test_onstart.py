"""The check at the workflow's start on a machine without NVIDIA GPUs: it stops a local run of the paper's
DAG, not one whose jobs an executor submits to a cluster (profiles/slurm from a login node without GPUs).
SLURM's commands are replaced by ones that fail, so nothing is submitted anywhere."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from slmserve import nvml
from tests.conftest import ROOT, SNAKEMAKE
from tests.test_slurm import GPU_RULES

SLURM_COMMANDS = ("sbatch", "srun", "squeue", "sacct", "sacctmgr", "sshare", "scontrol", "sinfo", "scancel")
NO_GPU = "no NVIDIA GPU visible"


def run_paper_probe(tmp_path: Path, profile: str, *args: str) -> str:
    """The paper configuration's OPT-125M capacity probe with ``profiles/<profile>``, run in ``tmp_path`` (its
    logs and .snakemake stay there): Snakemake's output."""
    fake = tmp_path / "bin"
    fake.mkdir()
    for cmd in SLURM_COMMANDS:
        (fake / cmd).write_text(f'#!/bin/sh\necho "{cmd}: no SLURM in this test" >&2\nexit 1\n')
        (fake / cmd).chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    out = tmp_path / "results"
    cmd = [
        SNAKEMAKE, "-s", str(ROOT / "Snakefile"), str(out / "capacity/opt125m-whole.json"),
        "--workflow-profile", str(ROOT / "profiles" / profile), "--configfile", str(ROOT / "config/config.yaml"),
        "--config", f"outdir={out}", f"figdir={tmp_path / 'figs'}", *args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0  # without a GPU or a SLURM, neither run can measure
    assert not (out / "capacity/opt125m-whole.json").exists()
    return proc.stdout + proc.stderr


@pytest.mark.skipif(nvml.gpu_count() > 0, reason="this machine has NVIDIA GPUs: the check lets every run start")
@pytest.mark.skipif(
    importlib.util.find_spec("snakemake_executor_plugin_slurm") is None,
    reason="snakemake-executor-plugin-slurm is not installed in this environment",
)
def test_slurm_profile_submits_from_a_host_without_gpu(tmp_path: Path) -> None:
    text = run_paper_probe(tmp_path, "slurm", "--slurm-init-seconds-before-status-checks", "1")
    assert NO_GPU not in text, text[-3000:]
    # it got past the check to the submission, which the fake SLURM refused
    assert "rule kv_probe:" in text and "no SLURM in this test" in text, text[-3000:]


@pytest.mark.skipif(nvml.gpu_count() > 0, reason="this machine has NVIDIA GPUs: the check lets every run start")
def test_local_profile_still_stops_without_gpu(tmp_path: Path) -> None:
    text = run_paper_probe(tmp_path, "local", "--cores", "1")
    assert NO_GPU in text and "make demo" in text, text[-3000:]
    assert "rule kv_probe:" not in text  # stopped before any job


def test_slurm_profile_sizes_every_gpu_rule() -> None:
    """A GPU rule without set-resources would get the light jobs' defaults: one CPU, 8 GB, 30 minutes."""
    prof = yaml.safe_load((ROOT / "profiles/slurm/config.yaml").read_text())
    assert "sweep" in GPU_RULES and "calibration" in GPU_RULES  # the rules were found in the workflow
    for rule in GPU_RULES:
        res = prof["set-resources"].get(rule) or {}
        assert {"cpus_per_gpu", "mem_mb", "runtime"} <= set(res), f"profiles/slurm: {rule} has {res}"
        assert "gpu" not in res  # each GPU rule declares its own GPU count (the profile says why)
