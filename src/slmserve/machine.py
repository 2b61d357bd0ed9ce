"""A short, stable name for the machine a job runs on, so that each machine gets its own calibration point.

``machine_id()`` is ``<gpu model>-<hash>``: the first GPU's model name in lower case with every run of other
characters than letters and digits as one ``-`` ("NVIDIA H100 80GB HBM3" -> ``h100-80gb-hbm3``), then the first
8 hex digits of the SHA-256 of the machine's GPU UUIDs, sorted (the physical GPUs, whatever their order or
``CUDA_VISIBLE_DEVICES``). Without NVML or GPUs it is ``cpu-<hash>`` of the host name.
"""

from __future__ import annotations

import hashlib
import platform
import re
from typing import Any

from slmserve import nvml


def slug(name: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"h100-80gb-hbm3"`` (the vendor's name dropped)."""
    s = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return s.removeprefix("nvidia-") or "gpu"


def _short_hash(parts: list[str]) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:8]


def machine_id(nvml_module: Any | None = None, hostname: str | None = None) -> str:
    """This machine's name (module docstring); ``nvml_module`` and ``hostname`` replace pynvml and the host."""
    try:
        with nvml.session(nvml_module) as nv:
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(int(nv.nvmlDeviceGetCount()))]
            uuids = sorted(_text(nv.nvmlDeviceGetUUID(h)) for h in handles)
            name = _text(nv.nvmlDeviceGetName(handles[0])) if handles else ""
    except nvml.NvmlUnavailable:
        uuids, name = [], ""
    if uuids:
        return f"{slug(name)}-{_short_hash(uuids)}"
    return f"cpu-{_short_hash([hostname if hostname is not None else platform.node()])}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
