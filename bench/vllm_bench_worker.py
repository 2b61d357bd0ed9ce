"""``vllm bench serve`` run many times in one process: vLLM imported once, not once a run (20-25 s a run on an
H200 host, 40% of a fidelity lease in m85).

    python -O bench/vllm_bench_worker.py        (started by :class:`bench.fidelity.BenchWorker`)

It prints ``{"ready": true}`` once vLLM's benchmark module is imported, then reads one JSON line per run from
stdin, ``{"argv": [...], "log": PATH}``: the arguments of ``vllm bench serve`` (:func:`bench.fidelity.bench_args`)
and the file its output goes to (both file descriptors 1 and 2, so C-level writes land there too). It runs
vLLM's own ``main`` on them, as the launcher of a separate process does (:data:`bench.fidelity.BENCH_LAUNCHER`),
and answers ``{"rc": 0}`` or ``{"rc": 1, "error": "..."}`` on its original stdout. It exits at the end of
stdin, so it ends with the process that started it. It imports nothing of this project: the process holds what
a ``vllm bench serve`` process holds.

Before each run it unfreezes and collects the heap that the last run's ``main`` froze (``freeze_gc_heap``), so
a run starts from a collected heap, as in a new process.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback


def _answer(ctl, obj: dict) -> None:
    ctl.write(json.dumps(obj) + "\n")
    ctl.flush()


def serve(stdin, ctl) -> None:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    _answer(ctl, {"ready": True})
    for line in stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        gc.unfreeze()
        gc.collect()
        saved = os.dup(1), os.dup(2)
        with open(job["log"], "a") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                p = FlexibleArgumentParser(prog="vllm bench serve")
                add_cli_args(p)
                main(p.parse_args(job["argv"]))
                answer = {"rc": 0}
            except (Exception, SystemExit) as exc:  # argparse's SystemExit too: the run failed, the worker goes on
                traceback.print_exc()
                answer = {"rc": 1, "error": f"{type(exc).__name__}: {exc}"[-300:]}
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
        _answer(ctl, answer)


if __name__ == "__main__":
    # The answers go to a copy of the original stdout: file descriptor 1 points at each run's log meanwhile.
    serve(sys.stdin, os.fdopen(os.dup(1), "w"))
