"""What every measuring job does around its work: stop on SIGTERM/SIGINT/SIGHUP, stop when the Snakemake process
that started it is gone, and refuse to measure a target that another live job is measuring.

``with guard(targets, label):`` around a job's body:

* SIGTERM, SIGINT and SIGHUP raise :class:`slmserve.server.Terminated` in the main thread, so ``with`` blocks
  unwind and stop the job's servers;
* a watcher thread sends the job SIGTERM within :data:`WATCH_S` seconds of the loss of a Snakemake
  process above it: a job orphaned by ``kill -9`` of Snakemake stops instead of measuring on beside a
  rerun (a job started without Snakemake, e.g. a benchmark detached with ``setsid``, is not watched);
* an exclusive ``flock`` on ``.<first target>.measuring`` beside the targets, with the holder's PID, host and
  start time in it: a second job for the same targets stops at once with a message naming that PID.
  The file is deleted when the job ends.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import signal
import socket
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil

from slmserve.server import install_signal_handlers, terminating

WATCH_S = 2.0


class TargetBusyError(RuntimeError):
    """Another live job holds the measuring lock of these targets."""


def is_snakemake(argv: Sequence[str]) -> bool:
    """Whether a command line runs Snakemake itself: its console script (``snakemake ...``), or a Python
    interpreter running that script or ``-m snakemake`` (past interpreter options such as ``-u``, ``-sP`` or
    ``-X dev``). Only the program counts: a shell whose script merely mentions Snakemake (``bash -c "...; tail
    snakemake.log"``, a job's ``.snakemake/scripts`` wrapper) does not, since its exit while Snakemake lives
    would stop a healthy job (2026-11-28, a KV-cache probe)."""
    if not argv:
        return False
    if os.path.basename(argv[0]) == "snakemake":
        return True
    if not os.path.basename(argv[0]).startswith(("python", "pypy")):
        return False
    args = iter(argv[1:])
    for arg in args:  # Python's own options, as its command line parses them, up to the program it runs
        if arg.startswith("--") or arg == "-":
            continue
        if not arg.startswith("-"):
            return os.path.basename(arg) == "snakemake"  # the script it runs
        for i, flag in enumerate(arg[1:], start=1):
            if flag == "m":
                return (arg[i + 1 :] or next(args, "")).split(".")[0] == "snakemake"
            if flag == "c":
                return False
            if flag in "WX":  # their value is the rest of this argument or the next one
                if i == len(arg) - 1:
                    next(args, None)
                break
    return False


def _ancestors() -> list[psutil.Process]:
    """The processes to watch: every Snakemake process above this one."""
    try:
        parents = psutil.Process().parents()
    except psutil.Error:
        return []
    smk = []
    for proc in parents:
        with contextlib.suppress(psutil.Error):
            if is_snakemake(proc.cmdline()):
                smk.append(proc)
    return smk


def _watch(ancestors: list[psutil.Process], stop: threading.Event) -> None:
    while not stop.wait(WATCH_S):
        if terminating():  # already stopping: a second signal must not cut the cleanup short
            return
        for proc in ancestors:
            if not proc.is_running():  # also false for a recycled PID (psutil compares start times)
                os.kill(os.getpid(), signal.SIGTERM)
                return


def lock_path(target: str | os.PathLike[str]) -> Path:
    """The measuring lock of a job whose first target is ``target``."""
    target = Path(target)
    return target.with_name(f".{target.name}.measuring")


def _lock(path: Path, attempts: int = 5) -> int:
    """An fd holding ``path``'s exclusive flock, or -1 if a live holder has it. A file its last holder
    deleted between our open and our lock is void: open the new one."""
    for _ in range(attempts):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return -1
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
    return -1


@contextlib.contextmanager
def target_lock(target: str | os.PathLike[str], label: str) -> Iterator[None]:
    """Hold the measuring lock of ``target`` (see the module docstring) for the ``with`` block."""
    path = lock_path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _lock(path)
    if fd < 0:
        try:
            info = json.loads(path.read_text() or "{}")
        except (OSError, ValueError):
            info = {}
        raise TargetBusyError(
            f"{target}: another live job is measuring it (PID {info.get('pid', '?')} on {info.get('host', '?')}, "
            f"since {info.get('since', '?')}, {info.get('label', '')}). Wait for it to end, or stop it "
            f"(kill {info.get('pid', '<pid>')}) before measuring again."
        ) from None
    since = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since,
                              "label": label}).encode(), 0)  # fmt: skip
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)


@contextlib.contextmanager
def guard(targets: Sequence[str | os.PathLike[str]], label: str) -> Iterator[None]:
    """Signal handlers, the parent watcher and the measuring lock of ``targets[0]`` around a job."""
    install_signal_handlers()
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(_ancestors(), stop), name="slmserve-parent", daemon=True)
    watcher.start()
    try:
        with target_lock(targets[0], label):
            yield
    finally:
        stop.set()
