"""bench/device_import.py: a device call's results.tgz merged into a checkout (no device needed)."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from bench import device_import
from tests.conftest import ROOT

RUN = "results/tp2/runs/opt125m/tp1-out256-rateinf"


def _archive(tmp_path: Path, files: dict[str, str]) -> Path:
    path = tmp_path / "results.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return path


def _checkout(tmp_path: Path, files: dict[str, str]) -> Path:
    repo = tmp_path / "repo"
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    return repo


def test_results_replace_the_tree_saved_repeats_travel_and_finished_points_lose_theirs(tmp_path: Path) -> None:
    archive = _archive(tmp_path, {
        "snakemake.log": "smk", ".started": "t0",
        f"{RUN}/bs1.requests.parquet": "new bs1", f"{RUN}/bs1.telemetry.parquet": "tel bs1",
        f"{RUN}/.bs2.requests.parquet.measuring": "", f"{RUN}/.partial/bs2.r0.requests.parquet": "r0 of bs2",
        "results/h200-36gb/replication/opt1.3b_r3.parquet": "x3",
        "results/h200-36gb/replication/opt1.3b_r3.telemetry.parquet": "x3 tel",
        "logs/tp2/runs/opt125m/tp1-out256-rateinf.log": "job\n",
        "logs/tp2/runs/opt125m/tp1-out256-rateinf/server-all.log": "server\n",
        "logs/h200-36gb/replication/opt1.3b_r3/server-r3-0.log": "server\n", "logs/mps/control.log": "mps\n",
        "logs/tp2/calibration/m/opt125m.log": "cal\n",
    })  # fmt: skip
    repo = _checkout(tmp_path, {
        f"{RUN}/bs1.requests.parquet": "old bs1",  # committed, measured again
        f"{RUN}/.partial/bs1.r0.requests.parquet": "r0", f"{RUN}/.partial/bs1.r0.telemetry.parquet": "r0 tel",
        f"{RUN}/.partial/bs3.r0.requests.parquet": "r0 of bs3",  # a point still unfinished: kept
    })  # fmt: skip
    done = device_import.import_archive(archive, repo, repo / "bench/results/h200x2-m47")
    run = repo / RUN
    assert (run / "bs1.requests.parquet").read_text() == "new bs1"
    assert (run / "bs1.telemetry.parquet").read_text() == "tel bs1"
    assert (repo / "results/h200-36gb/replication/opt1.3b_r3.telemetry.parquet").read_text() == "x3 tel"
    assert not (run / ".bs2.requests.parquet.measuring").exists()
    assert sorted(p.name for p in (run / ".partial").iterdir()) == [
        "bs2.r0.requests.parquet",
        "bs3.r0.requests.parquet",
    ]
    assert done.saved == [f"{RUN}/.partial/bs2.r0.requests.parquet"]
    assert done.discarded == [f"{RUN}/bs1.requests.parquet"]
    assert not list(repo.rglob("*.import-tmp"))
    logs = repo / "bench/results/h200x2-m47"
    assert (logs / "snakemake.log").read_text() == "smk"
    assert (logs / "jobs.log").read_text() == (
        "== logs/tp2/calibration/m/opt125m.log\ncal\n== logs/tp2/runs/opt125m/tp1-out256-rateinf.log\njob\n"
    )
    assert not (repo / "snakemake.log").exists() and not (repo / ".started").exists() and not (repo / "logs").exists()


def test_a_finished_job_with_nothing_else_saved_leaves_no_partial_folder(tmp_path: Path) -> None:
    archive = _archive(tmp_path, {"snakemake.log": "", f"{RUN}/bs512.requests.parquet": "done"})
    repo = _checkout(tmp_path, {f"{RUN}/.partial/bs512.r0.requests.parquet": "r0"})
    device_import.import_archive(archive, repo, repo / "bench/results/m1")
    assert not (repo / RUN / ".partial").exists()
    assert (repo / "bench/results/m1/jobs.log").read_text() == ""


def test_refuses_a_foreign_archive_or_a_used_logs_folder_before_writing(tmp_path: Path) -> None:
    repo = _checkout(tmp_path, {"bench/results/m1/jobs.log": "earlier machine"})
    foreign = _archive(tmp_path, {f"{RUN}/bs1.requests.parquet": "x"})
    with pytest.raises(ValueError, match=r"no snakemake\.log in it"):
        device_import.import_archive(foreign, repo, repo / "bench/results/m2")
    assert not (repo / RUN).exists() and not (repo / "bench/results/m2").exists()
    ours = _archive(tmp_path, {"snakemake.log": "", f"{RUN}/bs1.requests.parquet": "x"})
    with pytest.raises(ValueError, match=r"m1 exists: name this machine's logs folder anew"):
        device_import.import_archive(ours, repo, repo / "bench/results/m1")
    assert (repo / "bench/results/m1/jobs.log").read_text() == "earlier machine" and not (repo / RUN).exists()


def test_the_script_reports_and_fails_with_the_reason(tmp_path: Path) -> None:
    archive = _archive(tmp_path, {"snakemake.log": "", f"{RUN}/bs1.requests.parquet": "x"})
    repo = _checkout(tmp_path, {f"{RUN}/.partial/bs1.r0.requests.parquet": "r0"})
    script = [sys.executable, str(ROOT / "bench/gpu_import.py"), str(archive), "m3", "--repo", str(repo)]
    ok = subprocess.run(script, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "1 result files into the tree" in ok.stdout and f"done: {RUN}/bs1.requests.parquet" in ok.stdout
    again = subprocess.run(script, capture_output=True, text=True)
    assert again.returncode == 1 and "gpu_import:" in again.stderr and "m3 exists" in again.stderr


def test_fresh_paths_leave_the_tree_first_so_a_cut_short_sweep_does_not_look_done(tmp_path: Path) -> None:
    archive = _archive(tmp_path, {"snakemake.log": "", f"{RUN}/.partial/bs1.r0.requests.parquet": "new r0"})
    repo = _checkout(tmp_path, {f"{RUN}/bs1.requests.parquet": "committed, measured again",
                                "results/tp2/runs/opt1.3b/tp1/bs1.requests.parquet": "kept"})  # fmt: skip
    device_import.import_archive(archive, repo, repo / "bench/results/m1", fresh=["results/tp2/runs/opt125m"])
    assert sorted(p.relative_to(repo / RUN).as_posix() for p in (repo / RUN).rglob("*")) == [
        ".partial",
        ".partial/bs1.r0.requests.parquet",
    ]
    assert (repo / "results/tp2/runs/opt1.3b/tp1/bs1.requests.parquet").read_text() == "kept"
    for bad in ("../elsewhere", "/results", "."):
        with pytest.raises(ValueError, match="give a path inside the checkout"):
            device_import.import_archive(archive, repo, repo / "bench/results/m2", fresh=[bad])
    assert not (repo / "bench/results/m2").exists()
