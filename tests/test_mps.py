"""Stopping the MPS daemon when a signal interrupts it (the stand-in control binary of test_replicas)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slmserve import mps, server
from tests.test_replicas import control  # noqa: F401  (a fixture)
from tests.test_server import gone

# a replication job holding a daemon, until it is killed
JOB = (
    "import sys, time; from pathlib import Path; from slmserve import mps; "
    "mps.Daemon(['0'], Path(sys.argv[1])).start(); print('up', flush=True); time.sleep(120)"
)


def test_a_job_killed_outright_takes_its_daemon_along(tmp_path: Path, control: Path) -> None:  # noqa: F811
    job = subprocess.Popen([sys.executable, "-c", JOB, str(tmp_path / "logs")], stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "up"
        daemon = int(Path(f"{control}.pid").read_text())
        assert not gone(daemon)
    finally:
        job.kill()
        job.wait()
    deadline = time.monotonic() + 10
    while not gone(daemon) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(daemon)  # the death signal reached it (a -d daemon would run on under init)


def test_a_signal_during_the_quit_asks_again_before_the_pipe_goes(
    tmp_path: Path,
    control: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    daemon = mps.Daemon(["0"], tmp_path / "logs")
    daemon.start()
    pipe = Path(daemon.env()["CUDA_MPS_PIPE_DIRECTORY"])
    real, interrupted = daemon._control, []

    def first_quit_interrupted(*args: str, stdin: str | None = None) -> str:
        if stdin == "quit\n" and not interrupted:
            interrupted.append(True)
            raise server.Terminated(signal.SIGTERM)
        return real(*args, stdin=stdin)

    monkeypatch.setattr(daemon, "_control", first_quit_interrupted)
    with pytest.raises(server.Terminated):
        daemon.stop()
    assert control.read_text().splitlines()[-1] == f"quit {pipe}"  # the daemon was told before its pipe went
    assert not pipe.exists()
