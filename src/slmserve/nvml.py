"""The package's one way into NVML (``pynvml``, from nvidia-ml-py): a session and the few reads it needs.

Every GPU index here is a physical NVML index (NVML ignores ``CUDA_VISIBLE_DEVICES``). ``pynvml`` is
imported when a session starts, so a CPU machine need not have it. Each function takes ``nvml_module``,
a module with pynvml's API to use instead (a fake, in tests).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

log = logging.getLogger(__name__)


class NvmlUnavailable(RuntimeError):
    """NVML could not be imported or initialised; ``__cause__`` holds the original error."""


@contextlib.contextmanager
def session(
    nvml_module: Any | None = None, *, on_shutdown_error: Callable[[Exception], None] | None = None
) -> Iterator[Any]:
    """``nvmlInit`` on entry and ``nvmlShutdown`` on exit; yields the module.

    Raises :class:`NvmlUnavailable` when NVML is missing or its initialisation fails. An error of
    ``nvmlShutdown`` is passed to ``on_shutdown_error`` (by default logged), never raised.
    """
    try:
        if nvml_module is None:
            import pynvml as nvml_module
        nvml_module.nvmlInit()
    except Exception as exc:
        raise NvmlUnavailable(str(exc)) from exc
    try:
        yield nvml_module
    finally:
        try:
            nvml_module.nvmlShutdown()
        except Exception as exc:
            if on_shutdown_error is None:
                log.debug("nvmlShutdown failed: %s", exc)
            else:
                on_shutdown_error(exc)


def gpu_count(nvml_module: Any | None = None) -> int:
    """How many GPUs NVML sees; 0 when NVML is missing or fails."""
    try:
        with session(nvml_module) as nv:
            return int(nv.nvmlDeviceGetCount())
    except Exception as exc:
        log.debug("no GPU count from NVML (%s)", exc)
        return 0


def total_memory_bytes(index: int, nvml_module: Any | None = None) -> int:
    """Total memory of GPU ``index`` in bytes; raises :class:`NvmlUnavailable` or NVML's error."""
    with session(nvml_module) as nv:
        return int(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(index)).total)


def names_and_driver(indices: Sequence[int], nvml_module: Any | None = None) -> tuple[list[str], str]:
    """The model names of GPUs ``indices`` and the driver version; raises as :func:`total_memory_bytes`."""
    with session(nvml_module) as nv:
        names = [str(nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(i))) for i in indices]
        return names, str(nv.nvmlSystemGetDriverVersion())


def uuid_indices(uuids: Sequence[str], nvml_module: Any | None = None) -> dict[str, int | None]:
    """NVML index of each GPU or MIG UUID (a MIG instance gives its parent GPU), None where unknown.

    Raises :class:`NvmlUnavailable`. Like CUDA, a unique UUID prefix and the old MIG form
    ``MIG-GPU-<uuid>/<gi>/<ci>`` are accepted.
    """
    with session(nvml_module) as nv:
        return {uid: _uuid_index(nv, uid) for uid in uuids}


def _as_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _uuid_index(nv: Any, uid: str) -> int | None:
    try:
        handle = nv.nvmlDeviceGetHandleByUUID(uid)
        with contextlib.suppress(Exception):
            if nv.nvmlDeviceIsMigDeviceHandle(handle):
                handle = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
        return int(nv.nvmlDeviceGetIndex(handle))
    except Exception:
        pass
    want = uid[len("MIG-") :].split("/")[0] if uid.startswith("MIG-GPU-") else uid
    try:
        for i in range(int(nv.nvmlDeviceGetCount())):
            if _as_str(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i))).startswith(want):
                return i
    except Exception:
        pass
    return None
