"""NVIDIA MPS for the replicas of one replication job: a job-private control daemon.

Under MPS the replica servers' kernels run concurrently on the GPU instead of being time-sliced. The job
starts its own control daemon (``nvidia-cuda-mps-control -f``, its child) with a private pipe and log directory
(``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``) and the job's ``CUDA_VISIBLE_DEVICES``; every
replica server gets the same variables (:meth:`Daemon.env`), so it connects to this daemon and no other.
The daemon starts its MPS server when the first client connects; :meth:`Daemon.check_server` asks the
daemon for its servers after the replicas are up. Leaving the ``with`` block, however it is left
(success, an exception, the SIGTERM that :mod:`slmserve.jobguard` turns into one), quits the daemon with
``echo quit | nvidia-cuda-mps-control``; a job killed outright (SIGKILL) takes the daemon and its MPS
server along through the death signal (checked on an H200, 2026-11-29: both gone within 1 s, a client
still connected; a ``-d`` daemon and its server stayed, under init; ``bench/results/h200-m51-mps/``).
The GPU's compute mode is never changed: MPS clients of one daemon share a GPU in the default mode.

Where MPS cannot run (no GPU: the CPU engine; no control binary on the host) :func:`unavailable` says why,
and the replication job records the run as ``unsupported`` with that reason.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from slmserve import server

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
# Where the NVIDIA container toolkit mounts the binaries when they are not on PATH.
FALLBACK_DIRS = ("/usr/local/nvidia/bin", "/usr/bin")
CONTROL_ENV = "SLMSERVE_MPS_CONTROL"  # an explicit path to the control binary
TIMEOUT_S = 30.0


class MpsError(RuntimeError):
    """The MPS daemon did not start, did not start a server, or did not quit."""


def control_binary() -> str | None:
    """The control binary: ``$SLMSERVE_MPS_CONTROL``, else on PATH, else in :data:`FALLBACK_DIRS`."""
    explicit = os.environ.get(CONTROL_ENV)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which(CONTROL)
    if found:
        return found
    for folder in FALLBACK_DIRS:
        path = Path(folder) / CONTROL
        if os.access(path, os.X_OK):
            return str(path)
    return None


def unavailable(gpu_ids: Sequence[str], off: str | None = None) -> str | None:
    """Why MPS cannot run for a job holding ``gpu_ids``; None if it can. ``off``: the setting that turns
    this job's MPS off, named in the answer (by default the equal split's)."""
    off = off or "experiments.replication.mps: false"
    if not gpu_ids:
        return f"MPS needs a GPU; this job has none (CPU engine): set {off}"
    if control_binary() is None:
        return (f"MPS control daemon not found ({CONTROL} not on PATH nor in {', '.join(FALLBACK_DIRS)}; "
                f"set {CONTROL_ENV} to its path, or {off})")  # fmt: skip
    return None


class Daemon:
    """A job-private MPS control daemon for ``gpu_ids``; use as a context manager."""

    def __init__(self, gpu_ids: Sequence[str], log_dir: Path, timeout_s: float = TIMEOUT_S) -> None:
        binary = control_binary()
        if binary is None:
            raise MpsError(unavailable(gpu_ids) or CONTROL + " not found")
        self.binary = binary
        self.gpu_ids = list(gpu_ids)
        self.log_dir = Path(log_dir)
        self.timeout_s = timeout_s
        # The pipe directory holds Unix sockets (path length limited): a short private one under /tmp.
        self.pipe_dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.running = False

    def env(self) -> dict[str, str]:
        """What the daemon and every client of it need in its environment."""
        if self.pipe_dir is None:
            raise MpsError("the MPS daemon is not started")
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
                "CUDA_VISIBLE_DEVICES": ",".join(self.gpu_ids)}  # fmt: skip

    def _environ(self) -> dict[str, str]:
        return {**os.environ, **self.env()}

    def _control(self, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run([self.binary, *args], input=stdin, capture_output=True, text=True,
                              env=self._environ(), timeout=self.timeout_s, check=False)  # fmt: skip
        if done.returncode != 0:
            raise MpsError(f"{self.binary} {' '.join(args) or '<<< ' + (stdin or '').strip()} exited with "
                           f"{done.returncode}: {(done.stderr or done.stdout).strip()[-500:]} "
                           f"(daemon log: {self.log_path})")  # fmt: skip
        return done.stdout

    def start(self) -> None:
        """Start the daemon in the foreground (``-f``) as this job's child, in a process group of its own with
        the death signal the vLLM servers get (:func:`slmserve.server.pdeathsig`): a job killed outright takes
        it and its MPS server along, where ``-d`` would leave both to init. Wait for its control socket; if
        it does not start, leave nothing behind."""
        self.pipe_dir = Path(tempfile.mkdtemp(prefix="slmserve-mps-"))
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as out:  # -f logs to stdout, not to the log directory
                self.proc = subprocess.Popen([self.binary, "-f"], stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=subprocess.STDOUT, env=self._environ(),
                                             start_new_session=True, preexec_fn=server.pdeathsig)  # fmt: skip
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.running = True

    @property
    def log_path(self) -> Path:
        return self.log_dir / "control.log"

    def _wait_ready(self) -> None:
        """Until the daemon's control socket is there; an error naming its output if it exits or never opens it."""
        assert self.proc is not None and self.pipe_dir is not None
        deadline = time.monotonic() + self.timeout_s
        while not (self.pipe_dir / "control").exists():
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace").strip()[-500:]
                raise MpsError(f"{self.binary} -f exited with {self.proc.returncode}: {tail} "
                               f"(daemon log: {self.log_path})")  # fmt: skip
            if time.monotonic() > deadline:
                raise MpsError(f"{self.binary} -f opened no control socket in {self.pipe_dir} within "
                               f"{self.timeout_s:g} s (daemon log: {self.log_path})")  # fmt: skip
            time.sleep(0.05)

    def check_server(self) -> list[int]:
        """The pids of the daemon's MPS servers (one per user once a client connected); an error if none."""
        pids = [int(tok) for tok in self._control(stdin="get_server_list\n").split() if tok.isdigit()]
        if not pids:
            raise MpsError(f"no nvidia-cuda-mps-server runs under the daemon (daemon log: {self.log_dir})")
        return pids

    def stop(self) -> None:
        """Quit the daemon (it stops its servers), wait for it to exit (else stop its process group) and
        remove the pipe directory."""
        proc, self.proc = self.proc, None
        try:
            if self.running:
                self.running = False
                try:
                    self._control(stdin="quit\n")
                except BaseException:
                    # a signal's Terminated can cut the quit short; later signals are ignored (server.py), so
                    # ask once more: once the pipe directory goes, nothing could reach the daemon again
                    with contextlib.suppress(Exception):
                        self._control(stdin="quit\n")
                    raise
                if proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=self.timeout_s)
        finally:
            try:
                if proc is not None:
                    server.kill_group(proc, self.timeout_s)  # nothing left to stop after a clean quit
            finally:
                if self.pipe_dir is not None:
                    shutil.rmtree(self.pipe_dir, ignore_errors=True)
                    self.pipe_dir = None

    def __enter__(self) -> Daemon:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        try:
            self.stop()
        except (MpsError, OSError, subprocess.TimeoutExpired) as err:
            if exc is None:
                raise
            log.error("quitting the MPS daemon failed too: %s", err)  # keep the error that got us here
