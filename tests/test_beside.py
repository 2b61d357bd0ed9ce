"""Jobs measured beside other GPU jobs on one host: who holds the host's other GPU locks
(:func:`slmserve.gpuslots.neighbours`), what a repeat records (``beside``), what a point's summary says
(``beside``, ``n_beside``) and the caption line. On a 2-GPU host two one-GPU jobs run side by side and share
the host's CPUs: OPT-125M, host-bound, measured 98.8 req/s at b=256 beside another job and 151.9 alone on
the same H100 host (2026-11-25), so a reader must be able to tell the two apart."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from slmserve import analysis, calibration, figures, measure
from slmserve.gpuslots import Allocation, GpuSlots, neighbours
from slmserve.loadgen import LoadResult
from tests.test_figures import GPU, frame, run


def _env(tmp_path: Path, pool: str) -> dict[str, str]:
    return {"SLMSERVE_GPU_POOL": pool, "SLMSERVE_LOCK_DIR": str(tmp_path / "locks")}


def test_an_allocation_sees_the_other_jobs_holding_gpus_of_the_host(tmp_path: Path) -> None:
    env = _env(tmp_path, "0,1,2")
    with GpuSlots(1, label="opt125m tp1", env=env, timeout_s=0) as mine:
        assert mine.neighbours() == []  # alone
        with GpuSlots(2, label="opt1.3b tp2", env=env, timeout_s=0) as other:
            assert mine.neighbours() == [{"label": "opt1.3b tp2", "pid": os.getpid(), "gpus": ["1", "2"]}]
            assert other.neighbours() == [{"label": "opt125m tp1", "pid": os.getpid(), "gpus": ["0"]}]
            assert neighbours((), tmp_path / "locks") == [  # nobody's own: both jobs, sorted by label
                {"label": "opt1.3b tp2", "pid": os.getpid(), "gpus": ["1", "2"]},
                {"label": "opt125m tp1", "pid": os.getpid(), "gpus": ["0"]},
            ]
        assert mine.neighbours() == []  # the other job released its GPUs
        assert mine.beside is not None  # what measure() asks
        held = os.open(tmp_path / "locks" / "gpu-1.lock", os.O_RDWR)  # locked, its holder info not yet written
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(held, b"{}")
            assert mine.neighbours() == []
        finally:
            os.close(held)
    assert Allocation((), ()).beside is None  # a CPU job: unknown, never "alone"
    assert neighbours(("0",), tmp_path / "no-such-dir") == []


class StandInServer:
    """Stand-in for a running VllmServer in :func:`slmserve.measure.measure` (named as such): nothing
    listens at its address, so the gauge poller reads nothing."""

    base_url = "http://127.0.0.1:9"

    def counters(self) -> dict[str, float]:
        return {}

    def info(self) -> dict[str, Any]:
        return {"stand_in": True}

    def alive(self) -> bool:
        return True


def _no_requests(*_a: object) -> list[LoadResult]:
    """A made-up load result (named as such) without requests: what the loads of a repeat return."""
    return [LoadResult(records=[], t0_mono=time.monotonic(), t0_wall=time.time(), peak_inflight=0, lag_p50_s=None,
                       lag_p99_s=None, lag_max_s=None, lag_ok=True, inflight_ok=True, n_ok=0, n_error=0,
                       duration_s=None, warmup_done=0)]  # fmt: skip


def test_a_repeat_records_the_jobs_beside_it_at_its_start_and_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure, "_run_loads", _no_requests)
    a = {"label": "opt1.3b tp1", "pid": 7, "gpus": ["1"]}
    b = {"label": "opt125m tp1", "pid": 8, "gpus": ["2"]}
    answers = iter([[a], [b, a]])  # a ran through the repeat; b started during it
    m = measure.measure([StandInServer()], [None], [], interval_s=1.0, sample=False, where="",  # type: ignore[list-item]
                        beside=lambda: next(answers))  # fmt: skip
    assert m.meta["beside"] == [a, b]
    alone = measure.measure([StandInServer()], [None], [], interval_s=1.0, sample=False, where="",  # type: ignore[list-item]
                            beside=list)  # fmt: skip
    assert alone.meta["beside"] == []
    unasked = measure.measure([StandInServer()], [None], [], interval_s=1.0, sample=False, where="")  # type: ignore[list-item]
    assert "beside" not in unasked.meta


def test_a_failing_question_loses_no_repeat_and_records_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure, "_run_loads", _no_requests)
    answers = iter([[], None])

    def flaky() -> list[dict[str, Any]]:
        answer = next(answers)
        if answer is None:
            raise TypeError("unhashable type: 'list'")  # e.g. a lock file with odd holder info
        return answer

    m = measure.measure([StandInServer()], [None], [], interval_s=1.0, sample=False, where="",  # type: ignore[list-item]
                        beside=flaky)  # fmt: skip
    assert "beside" not in m.meta and m.meta["loads"]  # unknown, not "alone"; the repeat is kept


def test_a_points_summary_counts_the_repeats_that_had_company() -> None:
    texts = ["opt1.3b tp1 on GPU 1", "", "opt1.3b tp1 on GPU 1; opt13b tp1 on GPU 1"]
    rows = [{"path": "p", "repeat": i, "throughput_rps": 100.0 + i, "beside": t} for i, t in enumerate(texts)]
    rows += [{"path": "q", "repeat": i, "throughput_rps": 100.0, "beside": None} for i in range(2)]
    out = analysis.points(pl.DataFrame(rows))
    assert out.row(0, named=True)["beside"] == "opt1.3b tp1 on GPU 1; opt13b tp1 on GPU 1"
    assert out.row(0, named=True)["n_beside"] == 2
    assert out.row(1, named=True)["beside"] is None and out.row(1, named=True)["n_beside"] is None  # older files
    assert analysis.beside_text({"beside": [{"label": "x", "gpus": ["0", "1"]}]}) == "x on GPUs 0,1"
    assert analysis.beside_text({"beside": []}) == "" and analysis.beside_text({}) is None
    older = analysis.points(pl.DataFrame([{"path": "p", "repeat": 0, "throughput_rps": 1.0, "beside": None}]))
    assert older.schema["beside"] == pl.String and older.schema["n_beside"] == pl.Int64  # typed, not Null


def test_the_caption_says_which_points_ran_beside_other_jobs() -> None:
    rows = [{**run("opt125m", b), "n_repeats": 3, "n_beside": 3, "beside": "opt1.3b tp1 on GPU 1"} for b in (1, 8)]
    rows += [{**run("opt125m", b, tp=2), "n_repeats": 3, "n_beside": 0, "beside": ""} for b in (1, 8)]
    rows += [{**run("opt125m", 512), "n_repeats": 2, "n_beside": None, "beside": None}]  # an older file: unknown
    _, text = figures.throughput_latency(frame(rows))
    assert ("Measured while other GPU jobs of the workflow ran on the same host (sharing its CPUs, memory and "
            "power; a host-bound model is slowed by them): OPT-125M on 1 GPU at b=1, 8: 6 of 6 repeats, beside "
            "opt1.3b tp1 on GPU 1\n") in text  # fmt: skip
    alone = [{**run("opt125m", b), "n_repeats": 3, "n_beside": 0, "beside": ""} for b in (1, 8)]
    assert "Measured while other GPU jobs" not in figures.throughput_latency(frame(alone))[1]
    assert "No record of other GPU jobs" not in text  # one GPU id: nothing could have run beside it


def test_the_caption_names_points_of_a_multi_gpu_host_that_predate_the_record() -> None:
    """On a host of several GPUs a file without the record may have had company: the caption says so."""
    rows = [{**run("opt125m", b), "gpu_ids": "0", "n_repeats": 3, "n_beside": None, "beside": None} for b in (1, 8)]
    rows += [{**run("opt1.3b", b), "gpu_ids": "1", "n_repeats": 3, "n_beside": 0, "beside": ""} for b in (1, 8)]
    _, text = figures.throughput_latency(frame(rows))
    assert "No record of other GPU jobs beside them (measured before results recorded it): OPT-125M\n" in text
    recorded = [{**r, "n_beside": 0, "beside": ""} for r in rows]
    assert "No record of other GPU jobs" not in figures.throughput_latency(frame(recorded))[1]


def test_the_calibration_table_says_when_a_point_was_not_measured_alone() -> None:
    base = {"machine": "m1", "model": "opt125m", "gpu_model": "H100", "driver": "580", "cpu_model": "Xeon",
            "cpu_cores": 32, "engine_version": "0.26.0", "batch_size": 256, "n": 3, "throughput_rps": 100.0,
            "throughput_rps_sd": 1.0, "cv": 0.01, "ci_lo": 98.0, "ci_hi": 102.0, "created": "t",
            "path": "p"}  # fmt: skip
    alone = pl.DataFrame([{**base, "n_beside": 0, "beside": ""}])
    assert "beside" not in calibration.to_markdown(alone)
    shared = pl.DataFrame([{**base, "n_beside": 2, "beside": "opt13b tp1 on GPU 1"}])
    assert ("- m1 opt125m: 2 of 3 repeats measured beside other GPU jobs of the host (opt13b tp1 on GPU 1)"
            in calibration.to_markdown(shared))  # fmt: skip


def test_a_replication_caption_names_the_replicas_that_ran_beside_other_jobs() -> None:
    rows = [{"model": "opt125m", "family": "OPT", "params": "125M", "replicas": n, "batch_per_replica": 512 // n,
             "plan": "equal", "status": "ok", "reason": None, "gpu_model": GPU, "engine": "vllm",
             "engine_version": "0.26.0", "input_len": 512, "output_len": 256, "n_ok": 500,
             "throughput_rps": 10.0 * n, "latency_mean_s": 30.0 / n, "n_repeats": 3, "n_beside": 3 * (n == 2),
             "beside": "opt1.3b tp1 on GPU 1" if n == 2 else ""} for n in (1, 2, 3)]  # fmt: skip
    _, text = figures.replication_tradeoff(frame(rows))
    assert "a host-bound model is slowed by them): OPT-125M x2: 3 of 3 repeats, beside opt1.3b tp1 on GPU 1\n" in text
