"""GPU pinning for Snakemake jobs: which GPUs a job with ``resources: gpu=k`` may use.

Snakemake counts GPUs but does not say which ones a job gets, so the job takes ``k`` free ids itself,
``with GpuSlots(k, label=...) as alloc:``, each held by a non-blocking exclusive ``flock`` on one lock
file per id, and starts its server with ``env={**os.environ, **alloc.env()}`` (``CUDA_VISIBLE_DEVICES``).

Pool (the ids that may be handed out), first match wins:

1. ``SLMSERVE_GPU_POOL`` (comma-separated; set but empty means no GPUs), for tests and odd setups;
2. ``CUDA_VISIBLE_DEVICES`` when set (SLURM sets it to the allocated GPUs): integers or GPU/MIG UUIDs,
   kept as strings; ``""`` means no GPUs and, as in CUDA, a negative entry ends the list;
3. every GPU that NVML sees (``"0"`` … ``"n-1"``);
4. nothing (a CPU machine, or NVML missing or broken: an empty pool, not an error).

Locks live in ``SLMSERVE_LOCK_DIR``, else ``/tmp/slmserve-gpu-locks-<uid>[-slurm<jobid>]``. The directory
must be host-local, as GPU ids are per node (on a shared filesystem put the hostname in the path); the
SLURM suffix keeps jobs of different SLURM allocations, which may all number their GPUs from 0, apart.
A lock is released by :meth:`GpuSlots.release`, by leaving the ``with`` block, or by the kernel when the
holder dies however it dies. Lock files are never deleted (two holders could then lock two files of one
name). The descriptors are close-on-exec, so a server started with ``subprocess`` does not inherit them.
The holder's pid, host, label and start time are in the lock file for :func:`who_holds`.

Taking ``k`` GPUs is all or nothing (never holding some while waiting for others, so no deadlock), retried
every ``poll_s`` seconds until ``timeout_s``. Sharing a GPU on purpose (the replicas of one replication
run) is one job taking one slot and starting several servers on it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from slmserve import nvml

log = logging.getLogger(__name__)

POOL_ENV = "SLMSERVE_GPU_POOL"
LOCK_DIR_ENV = "SLMSERVE_LOCK_DIR"
CVD = "CUDA_VISIBLE_DEVICES"

#: How often a waiting acquirer says it is still waiting (seconds).
WAIT_LOG_EVERY_S = 60.0


class GpuPoolTooSmall(ValueError):
    """More GPUs were asked for than the pool holds: waiting would never help."""


class NoGpuError(RuntimeError):
    """GPUs were asked for, the pool is empty, and a CPU fallback was not allowed."""


class GpuSlotTimeout(TimeoutError):
    """The GPUs asked for did not become free within the timeout."""


@dataclass(frozen=True)
class Allocation:
    """The GPUs a job holds.

    ``ids`` are the pool entries as they appear in the pool: what goes into ``CUDA_VISIBLE_DEVICES``.
    ``nvml_indices`` are the physical NVML indices for telemetry, where they can be resolved: an
    integer id is taken to be the NVML index itself (true for a pool from NVML, and for
    ``CUDA_VISIBLE_DEVICES`` as SLURM sets it; CUDA numbers devices fastest-first unless
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, which differs from NVML's PCI order only on mixed-GPU hosts);
    a GPU or MIG UUID is looked up in NVML (a MIG instance gives its parent GPU's index); ids that
    cannot be resolved are left out, so ``nvml_indices`` may be shorter than ``ids``. No duplicates.
    An empty allocation means: run on the CPU.
    """

    ids: tuple[str, ...]
    nvml_indices: tuple[int, ...]
    lock_dir: Path | None = field(default=None, compare=False)  # where other jobs' locks are (neighbours)

    @property
    def is_cpu(self) -> bool:
        return not self.ids

    def neighbours(self) -> list[dict[str, Any]]:
        """The other jobs holding GPUs of this host now (:func:`neighbours`)."""
        return neighbours(self.ids, self.lock_dir) if self.lock_dir is not None else []

    @property
    def beside(self) -> Callable[[], list[dict[str, Any]]] | None:
        """:meth:`neighbours` for :func:`slmserve.measure.measure` where the locks can tell (GPUs taken
        through a lock directory); None for a CPU job, which shares the host's CPUs with jobs no lock shows."""
        return self.neighbours if self.ids and self.lock_dir is not None else None

    def env(self) -> dict[str, str]:
        """Environment for the server process: ``{"CUDA_VISIBLE_DEVICES": "a,b"}``.

        An empty (CPU) allocation returns ``{}``: the environment is left as it is. On a CPU machine
        there is nothing to hide, and an inherited ``CUDA_VISIBLE_DEVICES=""`` stays in force; we do not
        set ``""`` ourselves so that nothing a CPU engine might consult is hidden.
        """
        return {CVD: ",".join(self.ids)} if self.ids else {}


# ---------------------------------------------------------------------------------------------- pool


def _split(value: str) -> list[str]:
    """Comma-separated ids: stripped, empties dropped, a negative integer ends the list, no duplicates."""
    out: list[str] = []
    for raw in value.split(","):
        item = raw.strip()
        if not item:
            continue
        if re.fullmatch(r"-\d+", item):
            break
        if item not in out:
            out.append(item)
    return out


def gpu_pool(env: Mapping[str, str] | None = None) -> list[str]:
    """The GPU ids a job may take (see the module docstring for the order of sources)."""
    env = os.environ if env is None else env
    if POOL_ENV in env:
        return _split(env[POOL_ENV])
    if CVD in env:
        return _split(env[CVD])
    return [str(i) for i in range(nvml.gpu_count())]


def nvml_indices(ids: Iterable[str]) -> tuple[int, ...]:
    """Physical NVML indices of pool ids, where resolvable (see :class:`Allocation`)."""
    out: list[int] = []
    uuids: list[str] = []
    for gid in ids:
        if re.fullmatch(r"\d+", gid):
            out.append(int(gid))
        else:
            uuids.append(gid)
    if uuids:
        out.extend(_resolve_uuids(uuids))
    return tuple(dict.fromkeys(out))


def _resolve_uuids(uuids: list[str]) -> list[int]:
    try:
        found = nvml.uuid_indices(uuids)
    except nvml.NvmlUnavailable as exc:
        log.debug("NVML unavailable (%s): cannot resolve %s to NVML indices", exc, uuids)
        return []
    for uid in (uid for uid, idx in found.items() if idx is None):
        log.debug("GPU id %s not found in NVML: no telemetry index for it", uid)
    return [idx for idx in found.values() if idx is not None]


# --------------------------------------------------------------------------------------------- locks


def default_lock_dir(env: Mapping[str, str] | None = None) -> Path:
    """``SLMSERVE_LOCK_DIR``, else ``/tmp/slmserve-gpu-locks-<uid>[-slurm<jobid>]`` (host-local)."""
    env = os.environ if env is None else env
    if env.get(LOCK_DIR_ENV):
        return Path(env[LOCK_DIR_ENV])
    name = f"slmserve-gpu-locks-{os.getuid()}"
    if env.get("SLURM_JOB_ID"):
        name += f"-slurm{env['SLURM_JOB_ID']}"
    return Path("/tmp") / name


def lock_path(gpu: str, lock_dir: Path) -> Path:
    """Lock file of one GPU id; ids with characters unsafe in a file name get a hash to stay unique."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", gpu)
    if safe != gpu or not safe.strip("."):
        safe = f"{safe}-{hashlib.sha256(gpu.encode()).hexdigest()[:8]}"
    return lock_dir / f"gpu-{safe}.lock"


def _try_lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on ``path``, or None if someone else holds it."""
    # os.open makes non-inheritable fds already (PEP 446); O_CLOEXEC says so explicitly.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    except BaseException:
        os.close(fd)
        raise
    os.set_inheritable(fd, False)
    return fd


def _write_info(fd: int, info: Mapping[str, Any]) -> None:
    data = (json.dumps(dict(info), sort_keys=True) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _release_fds(fds: list[int]) -> None:
    """Clear the holder info (while still holding the lock) and close: closing releases the flock."""
    while fds:
        fd = fds.pop()
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        with contextlib.suppress(OSError):
            os.close(fd)


def who_holds(gpu: str, lock_dir: Path | None = None, env: Mapping[str, str] | None = None) -> dict | None:
    """Who holds GPU ``gpu``: ``{"pid", "host", "label", "since", "gpu"}``, or None if it is free.

    For debugging. It probes the lock with a brief non-blocking shared lock, so an acquirer racing with
    the probe may find the GPU busy for one poll interval. A holder that has locked but not yet written
    its info gives ``{}``.
    """
    return _holder(lock_path(gpu, lock_dir if lock_dir is not None else default_lock_dir(env)))


def _holder(path: Path) -> dict | None:
    """The holder info of one lock file (see :func:`who_holds`), or None if it is free or missing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
        else:
            return None  # we could lock it: nobody holds it (closing the fd drops our probe lock)
        raw = os.pread(fd, 65536, 0)
    finally:
        os.close(fd)
    try:
        info = json.loads(raw.decode() or "{}")
    except (ValueError, UnicodeDecodeError):
        return {"raw": raw.decode(errors="replace")}
    return info if isinstance(info, dict) else {"raw": info}


def neighbours(own: Iterable[str], lock_dir: Path) -> list[dict[str, Any]]:
    """The jobs other than the holder of ``own`` that hold GPU locks in ``lock_dir`` now: one
    ``{"label", "pid", "gpus"}`` per job (its GPU ids sorted), sorted by label. Only jobs that take their
    GPUs through this lock directory are seen: another user's, or another SLURM allocation's, are not. Each
    held lock is probed as :func:`who_holds` does: an acquirer meeting the probe retries a poll later."""
    mine, jobs = set(own), {}
    for path in sorted(lock_dir.glob("gpu-*.lock")):
        try:
            # a released lock is emptied: skip it unprobed, so an acquirer rarely meets the probe's lock
            info = _holder(path) if path.stat().st_size else None
        except OSError:
            continue
        if info is None or not info.get("gpu") or info["gpu"] in mine:
            continue  # free, or held but not yet described, or ours
        job = jobs.setdefault((info.get("pid"), info.get("label", "")), [])
        job.append(str(info["gpu"]))
    out = [{"label": label, "pid": pid, "gpus": sorted(gpus)} for (pid, label), gpus in jobs.items()]
    return sorted(out, key=lambda j: (str(j["label"]), str(j["pid"])))


def _describe_holders(ids: Iterable[str], lock_dir: Path) -> str:
    parts = []
    for gid in ids:
        try:
            info = who_holds(gid, lock_dir)
        except OSError:
            info = None
        if info is not None:
            pid, host, label = info.get("pid", "?"), info.get("host", "?"), info.get("label", "")
            parts.append(f"{gid}: pid {pid} on {host}" + (f" ({label})" if label else ""))
    return "; ".join(parts) or "none visible"


class GpuSlots:
    """Hold ``k`` GPUs of the pool for the duration of a ``with`` block (or until :meth:`release`).

    ``with GpuSlots(1, label=str(snakemake.output[0])) as alloc: start_server(env=alloc.env())``

    ``k == 0`` gives an empty allocation without touching any lock. An empty pool with ``k > 0`` gives
    an empty (CPU) allocation when ``allow_cpu`` is true and raises :class:`NoGpuError` otherwise.
    ``k`` larger than the pool raises :class:`GpuPoolTooSmall`; not getting ``k`` GPUs within
    ``timeout_s`` seconds (``None``: wait forever; ``0``: try once) raises :class:`GpuSlotTimeout`.
    ``env`` (default ``os.environ``) is where the pool and lock directory settings are read from.
    """

    def __init__(
        self,
        k: int,
        label: str = "",
        lock_dir: Path | None = None,
        timeout_s: float | None = 3600,
        poll_s: float = 1.0,
        allow_cpu: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        if poll_s <= 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s}")
        if timeout_s is not None and timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0 or None, got {timeout_s}")
        self.k = k
        self.label = label
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.allow_cpu = allow_cpu
        self._env: Mapping[str, str] = dict(os.environ if env is None else env)
        self.lock_dir = Path(lock_dir) if lock_dir is not None else default_lock_dir(self._env)
        self._fds: list[int] = []
        self._allocation: Allocation | None = None
        # Close the fds (so release the locks) if this object is dropped without release().
        self._finalizer = weakref.finalize(self, _release_fds, self._fds)

    @property
    def allocation(self) -> Allocation | None:
        """The current allocation, or None when not holding."""
        return self._allocation

    def acquire(self) -> Allocation:
        if self._allocation is not None:
            raise RuntimeError("GpuSlots already holds an allocation; release() it first")
        pool = gpu_pool(self._env)
        if self.k == 0:
            self._allocation = Allocation((), ())
            return self._allocation
        if not pool:
            if not self.allow_cpu:
                raise NoGpuError(
                    f"{self.label or 'job'}: {self.k} GPU(s) requested but the GPU pool is empty (no {POOL_ENV}, "
                    f"{CVD}={self._env.get(CVD)!r}, NVML sees no GPU) and the profile sets allow_cpu: false. "
                    "Run the job on a node with an NVIDIA GPU (under SLURM, a GPU partition), or use a CPU "
                    "profile such as config/smoke.yaml"
                )
            log.info("no GPUs in the pool: %r gets a CPU allocation", self.label or "job")
            self._allocation = Allocation((), ())
            return self._allocation
        if self.k > len(pool):
            raise GpuPoolTooSmall(
                f"{self.k} GPU(s) requested but the GPU pool has only {len(pool)}: {pool}. "
                f"Run Snakemake with --resources gpu=N where N is at most the pool size, give rules "
                f"fewer GPUs, or make more GPUs visible ({CVD}, or {POOL_ENV} to override the pool)."
            )
        self.lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        start = time.monotonic()
        next_log = 0.0
        while True:
            taken = self._try_take(pool)
            if taken is not None:
                break
            waited = time.monotonic() - start
            if self.timeout_s is not None and waited >= self.timeout_s:
                raise GpuSlotTimeout(
                    f"could not take {self.k} GPU slot(s) of pool {pool} within {self.timeout_s:g} s "
                    f"(lock dir {self.lock_dir}); held: {_describe_holders(pool, self.lock_dir)}. "
                    f"Snakemake's --resources gpu=N must not exceed the pool; look for stray jobs."
                )
            if waited >= next_log:
                level = logging.WARNING if next_log == 0.0 else logging.INFO
                log.log(
                    level,
                    "%r waiting for %d GPU slot(s) of pool %s (%.0f s so far); held: %s",
                    self.label or "job",
                    self.k,
                    pool,
                    waited,
                    _describe_holders(pool, self.lock_dir),
                )
                next_log = waited + WAIT_LOG_EVERY_S
            sleep = self.poll_s
            if self.timeout_s is not None:
                sleep = min(sleep, max(self.timeout_s - waited, 0.0))
            time.sleep(sleep)
        ids = tuple(taken)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "label": self.label}
        info["since"] = datetime.now(UTC).isoformat(timespec="seconds")
        for gid, fd in zip(ids, self._fds, strict=True):
            _write_info(fd, {**info, "gpu": gid})
        self._allocation = Allocation(ids=ids, nvml_indices=nvml_indices(ids), lock_dir=self.lock_dir)
        log.info("%r holds GPU(s) %s", self.label or "job", ",".join(ids))
        return self._allocation

    def _try_take(self, pool: list[str]) -> list[str] | None:
        """One all-or-nothing pass over the pool; the fds end up in ``self._fds`` on success."""
        taken: list[str] = []
        try:
            for gid in pool:
                if len(taken) == self.k:
                    break
                fd = _try_lock(lock_path(gid, self.lock_dir))
                if fd is not None:
                    self._fds.append(fd)
                    taken.append(gid)
        except BaseException:
            _release_fds(self._fds)
            raise
        if len(taken) < self.k:
            _release_fds(self._fds)
            return None
        return taken

    def release(self) -> None:
        """Release the GPUs (idempotent)."""
        _release_fds(self._fds)
        if self._allocation is not None and self._allocation.ids:
            log.info("%r released GPU(s) %s", self.label or "job", ",".join(self._allocation.ids))
        self._allocation = None

    def __enter__(self) -> Allocation:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
