"""Stopping the MPS daemon when a signal interrupts it (the stand-in control binary of test_replicas)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from slmserve import mps, server
from tests.test_replicas import control  # noqa: F401  (a fixture)


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
