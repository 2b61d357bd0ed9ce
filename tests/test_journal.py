"""A job stopped part-way keeps its measured repeats (slmserve.journal) and its rerun measures only the missing
ones; a point whose repeats ran on two machines says so in the summary and the captions. The measuring itself is
a stand-in function here (named as such); test_engine.py stops and resumes a real sweep on the CPU engine."""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl
import pytest

from slmserve import analysis, io, journal, layout, measure, runner
from slmserve.figures import captions
from slmserve.journal import Journal
from slmserve.measure import Measurement


def _job(tmp_path: Path, **kw: object) -> runner.SweepJob:
    fields = {"model": "opt125m", "model_path": "config/models/opt-125m", "load_format": "dummy", "tensor_parallel": 1,
              "batch_sizes": [1, 8], "prompts_path": tmp_path / "p.parquet", "outputs": {}, "log_dir": tmp_path,
              "input_len": 16, "output_len": 8, "num_requests": 4, "repeats": 3, **kw}  # fmt: skip
    return runner.SweepJob(**fields)


def _points(tmp_path: Path, job: runner.SweepJob, host: str = "here") -> list[runner.Point]:
    pts = []
    for b in job.batch_sizes:
        paths = (tmp_path / f"bs{b}.requests.parquet", tmp_path / f"bs{b}.telemetry.parquet")
        p = runner.Point(b, job, paths)
        p.head = {"run": p.meta_run(), "provenance": {"host": host, "batch": b}, "gpu_ids": []}
        pts.append(p)
    return pts


def stand_in_measurement(batch: int, k: int) -> Measurement:
    """What one repeat returns, made up: one request whose id tells its batch and call number."""
    req = pl.DataFrame({"request_id": [batch * 100 + k], "latency_s": [float(k)]})
    tel = pl.DataFrame({"t_mono": [float(k)], "power_w": [100.0 + k]})
    load = {"n_ok": 1, "duration_s": 1.0, "peak_inflight": 1, "lag_p99_s": 0.0}
    return Measurement(requests=req, telemetry=tel, meta={"t0_mono": 0.0, "call": k, "loads": [load]}, wall_s=1.0)


class StandInMeasurer:
    """``run_one`` for :func:`runner.measure_points` that stops the job (raises) after ``stop_after`` calls."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.calls: list[int] = []
        self.stop_after = stop_after

    def __call__(self, point: runner.Point) -> Measurement:
        if self.stop_after is not None and len(self.calls) == self.stop_after:
            raise KeyboardInterrupt("the job is stopped")
        self.calls.append(point.batch)
        return stand_in_measurement(point.batch, len(self.calls))


def test_settings_key_ignores_how_many_repeats_but_not_what_a_repeat_measures() -> None:
    run = {"model": "opt125m", "batch_size": 8, "repeats": 3, "repeat_budget_s": 600, "num_requests": 500}
    assert journal.settings_key(run) == journal.settings_key({**run, "repeats": 5, "repeat_budget_s": None})
    assert journal.settings_key(run) != journal.settings_key({**run, "num_requests": 100})


def test_a_stopped_job_resumes_with_only_its_missing_repeats(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    job = _job(tmp_path)
    first = StandInMeasurer(stop_after=3)  # pass 1: bs1, bs8; pass 2: bs1, then stopped
    with pytest.raises(KeyboardInterrupt):
        runner.measure_points(_points(tmp_path, job, "a"), first, 3, None, Journal("machine-a", {"host": "a"}))
    assert first.calls == [1, 8, 1]
    assert not list(tmp_path.glob("*.parquet"))  # nothing that looks done
    saved = sorted(p.name for p in (tmp_path / journal.DIR).iterdir())
    assert saved == [f"bs{b}.r{k}.{kind}.parquet" for b, k in (("1", 0), ("1", 1), ("8", 0))
                     for kind in ("requests", "telemetry")]  # fmt: skip

    second = StandInMeasurer()
    with caplog.at_level(logging.INFO, logger="slmserve.runner"):
        caplog.clear()  # only this run's lines: the first one's are captured too under --log-level=INFO
        runner.measure_points(_points(tmp_path, job, "b"), second, 3, None, Journal("machine-b", {"host": "b"}))
    assert second.calls == [8, 1, 8]  # 3 of the 6 repeats, in the order the stopped job would have kept
    progress = [r.getMessage() for r in caplog.records if " of up to " in r.getMessage()]
    assert progress == ["bs8.requests.parquet: repeat r1 of up to 3 saved in 1.0 s",
                        "bs1.requests.parquet: repeat r2 of up to 3 saved in 1.0 s",
                        "bs8.requests.parquet: repeat r2 of up to 3 saved in 1.0 s"]  # fmt: skip
    assert not (tmp_path / journal.DIR).exists()  # kept repeats are gone once the results are written
    meta = io.read_meta(tmp_path / "bs1.requests.parquet")
    reps = measure.repeats_of(meta)
    assert [r["machine"] for r in reps] == ["machine-a", "machine-a", "machine-b"]
    assert [r.get("resumed", False) for r in reps] == [True, True, False]
    assert reps[0]["provenance"] == {"host": "a", "batch": 1} and meta["provenance"] == {"host": "b", "batch": 1}
    assert [r["wall_s"] for r in reps] == [1.0, 1.0, 1.0]  # what decided each repeat, kept with the result
    reps8 = measure.repeats_of(io.read_meta(tmp_path / "bs8.requests.parquet"))
    assert reps8[0]["provenance"] == {"host": "a", "batch": 8}  # each point's own provenance, not the first's
    req = pl.read_parquet(tmp_path / "bs1.requests.parquet")
    assert req["repeat"].to_list() == [0, 1, 2] and req["request_id"].to_list() == [101, 103, 102]
    assert pl.read_parquet(tmp_path / "bs1.telemetry.parquet")["repeat"].to_list() == [0, 1, 2]


def test_a_resumed_job_measures_every_first_repeat_before_any_second(tmp_path: Path) -> None:
    # 2026-11-26, MPT-7B on an H200: resumed with r0 of b=1..128 saved, it measured r1 of b=4..16 while
    # b=256 had none, so the machine went back with b=256 still unmeasured
    job = _job(tmp_path, batch_sizes=[1, 8, 64])
    first = StandInMeasurer(stop_after=2)  # r0 of bs1 and bs8, then stopped before bs64
    with pytest.raises(KeyboardInterrupt):
        runner.measure_points(_points(tmp_path, job), first, 3, None, Journal("machine-a"))
    second = StandInMeasurer()
    runner.measure_points(_points(tmp_path, job), second, 3, None, Journal("machine-b"))
    assert second.calls == [64, 1, 8, 64, 1, 8, 64]


def test_repeats_of_another_gpu_model_or_engine_stop_the_job_and_stay(tmp_path: Path) -> None:
    job = _job(tmp_path, batch_sizes=[1])
    (p,) = _points(tmp_path, job)
    h100 = {"gpu_models": ["NVIDIA H100 80GB HBM3"], "engine": "vllm", "engine_version": "0.26.0"}
    Journal("m1", h100).save(p.paths, p.meta_run(), 0, stand_in_measurement(1, 0))
    h200 = Journal("m2", {**h100, "gpu_models": ["NVIDIA H200"]})
    with pytest.raises(journal.ResumeMismatch, match=r"gpu_models \['NVIDIA H100 80GB HBM3'\] there, "
                                                     r"\['NVIDIA H200'\] here.*move .*\.partial away"):  # fmt: skip
        h200.load(p.paths, p.meta_run())
    assert journal.partial_paths(p.paths, 0)[0].exists()  # nothing deleted
    newer = Journal("m2", {**h100, "engine_version": "0.27.0"})
    with pytest.raises(journal.ResumeMismatch, match=r"engine_version '0.26.0' there, '0.27.0' here"):
        newer.load(p.paths, p.meta_run())
    assert len(Journal("m3", h100).load(p.paths, p.meta_run())) == 1  # another machine of the same kind resumes
    unnamed = Journal("m4", {**h100, "gpu_models": []})  # NVML could not name this machine's GPUs
    assert len(unnamed.load(p.paths, p.meta_run())) == 1


def test_saved_repeats_are_dropped_only_once_every_point_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job stopped while writing its results (Snakemake then deletes the outputs it wrote) keeps every
    point's saved repeats."""
    job = _job(tmp_path, repeats=1)
    real, written = measure.write_point, []

    def write_then_stop(paths, head, runs):  # the second point's write is cut off
        if written:
            raise KeyboardInterrupt("stopped while writing")
        written.append(paths)
        return real(paths, head, runs)

    monkeypatch.setattr(runner, "write_point", write_then_stop)
    with pytest.raises(KeyboardInterrupt):
        runner.measure_points(_points(tmp_path, job), StandInMeasurer(), 1, None, Journal("m"))
    assert written and all(journal.has_saved(p.paths, p.meta_run()) for p in _points(tmp_path, job))


def test_repeats_of_other_settings_or_after_a_gap_are_set_aside_not_resumed(tmp_path: Path) -> None:
    job = _job(tmp_path, batch_sizes=[1])
    (p,) = _points(tmp_path, job)
    jr = Journal("m")
    for k in (0, 1, 3):  # r2 missing: r3 is not taken
        jr.save(p.paths, p.meta_run(), k, stand_in_measurement(1, k))
    assert [m.meta["call"] for m in jr.load(p.paths, p.meta_run())] == [0, 1]
    assert not journal.partial_paths(p.paths, 3)[0].exists()  # not resumed, with its telemetry, but kept:
    aside = tmp_path / journal.DIR / journal.SET_ASIDE
    key = journal.settings_key(p.meta_run())
    names = [f"{key}-bs1.r3.{kind}.parquet" for kind in ("requests", "telemetry")]
    assert sorted(f.name for f in aside.iterdir()) == names
    other = {**p.meta_run(), "num_requests": 7}
    assert jr.load(p.paths, other) == []  # other settings: nothing resumed, the files set aside
    assert sorted(f.name for f in (tmp_path / journal.DIR).iterdir()) == [journal.SET_ASIDE]
    assert len(list(aside.iterdir())) == 6 and (aside / f"{key}-bs1.r0.requests.parquet").exists()
    jr.save(p.paths, p.meta_run(), 0, stand_in_measurement(1, 0))
    assert jr.load(p.paths, other) == []  # the same name set aside again gets a number, nothing is overwritten
    assert (aside / f"{key}-1-bs1.r0.requests.parquet").exists() and len(list(aside.iterdir())) == 8
    jr.save(p.paths, p.meta_run(), 0, stand_in_measurement(1, 0))
    journal.partial_paths(p.paths, 0)[1].unlink()  # a repeat without its telemetry is not taken
    journal.partial_paths(p.paths, 1)[0].parent.joinpath("bs1.r1.requests.parquet").write_bytes(b"cut")
    assert jr.load(p.paths, p.meta_run()) == []
    assert not journal.partial_paths(p.paths, 1)[0].exists()  # cut short: no repeat in it, deleted
    assert len(list(aside.iterdir())) == 9  # r0's requests, set aside without its telemetry
    jr.save(p.paths, p.meta_run(), 0, stand_in_measurement(1, 0))
    assert jr.load(p.paths, other) == []  # a whole repeat again: one number for its two files, still a pair
    assert {f.name for f in aside.iterdir()} >= {f"{key}-3-bs1.r0.{kind}.parquet" for kind in ("requests", "telemetry")}
    journal.discard_saved(p.paths)
    assert aside.is_dir()  # the point's result is written: what was set aside stays


def test_summary_and_caption_count_the_machines_of_a_points_repeats() -> None:
    rows = pl.DataFrame({
        "path": ["a", "a", "b", "b", "c"], "repeat": [0, 1, 0, 1, 0], "model": ["m"] * 5,
        "batch_size": [1, 1, 8, 8, 64],
        "machine": ["x", "y", "x", "x", None], "throughput_rps": [1.0, 1.1, 2.0, 2.1, 3.0],
    })  # fmt: skip
    p = analysis.points(rows).sort("path")
    assert p["n_machines"].to_list() == [2, 1, None] and "machine" not in p.columns
    note = captions._repeats_note(p)
    assert "ran on up to 2 machines" in note and "Repeats of 1 point " in note
    assert "ran on" not in captions._repeats_note(p.filter(pl.col("path") != "a"))
    assert p["machines"].to_list() == ["x, y", "x", None]
    both = captions._repeats_note(p.filter(pl.col("path") != "b"))  # two machines, one point: said once
    assert "ran on up to 2 machines" in both and "The points ran on" not in both


def test_a_caption_names_the_machines_of_points_measured_on_several() -> None:
    """Points of one figure from two machines (each point on one): the caption says which ran where."""
    rows = pl.DataFrame({
        "path": ["a", "a", "b", "b", "c"], "repeat": [0, 1, 0, 1, 0], "model": ["m"] * 5,
        "batch_size": [1, 1, 8, 8, 64], "machine": ["x", "x", "y", "y", None], "throughput_rps": [1.0] * 5,
    })  # fmt: skip
    p = analysis.points(rows).sort("path")
    note = captions._repeats_note(p)
    assert "ran on up to" not in note  # no point's repeats were split
    names = [captions.point_name(r) for r in p.iter_rows(named=True)]
    assert "The points ran on 2 machines" in note
    assert f"x: {names[0]}; y: {names[1]}; not recorded: {names[2]}." in note
    mixed = analysis.points(rows.with_columns(machine=pl.Series(["x", "y", "y", "y", None]))).sort("path")
    assert "x + y: " in captions._repeats_note(mixed)  # a point of two machines beside one of one
    one = captions._repeats_note(p.filter(pl.col("path") != "b"))  # one machine, one point without
    assert "points ran on" not in one and f"Machine not recorded at 1 point: {names[2]}." in one
    assert "ran on" not in captions._repeats_note(p.filter(pl.col("path") == "a"))  # one machine: nothing to say
    none = p.with_columns(machines=pl.lit(None, pl.String))
    assert "The points' machines are not recorded" in captions._repeats_note(none)


def test_a_summary_names_every_code_version_that_measured_the_point() -> None:
    """A point resumed from an earlier job: its summary's git_sha lists both jobs' versions, not the writer's."""
    meta = {"provenance": {"git_sha": "c3"}, "status": "ok",
            "repeats": [{"repeat": 0, "resumed": True, "provenance": {"git_sha": "a1"}},
                        {"repeat": 1, "resumed": True, "provenance": {"git_sha": "b2"}}, {"repeat": 2}]}  # fmt: skip
    assert analysis._repeat_shas(meta) == "a1,b2,c3"
    assert analysis._repeat_shas({**meta, "repeats": [{"repeat": 0}]}) == "c3"
    assert analysis._repeat_shas({"provenance": {}, "status": "ok", "repeats": [{"repeat": 0}]}) is None


def test_a_summary_names_the_gpus_of_every_repeat_not_only_the_writers() -> None:
    """A point resumed on another GPU: its summary's gpu_ids lists each repeat's set, once, in order; a repeat
    saved before repeats recorded theirs counts as the file's (its NVML indices are another numbering)."""
    meta = {"gpu_ids": ["1"], "provenance": {}, "status": "ok",
            "repeats": [{"repeat": 0, "resumed": True, "gpu_ids": ["0"]},
                        {"repeat": 1, "resumed": True, "gpu_ids": ["2", "3"]},
                        {"repeat": 2, "resumed": True, "provenance": {"gpu_ids": [5]}},
                        {"repeat": 3, "gpu_ids": ["1"]}]}  # fmt: skip
    assert analysis.repeat_gpu_ids(meta) == "0 | 2,3 | 1"
    assert analysis.repeat_gpu_ids({**meta, "repeats": [{"repeat": 0}, {"repeat": 1}]}) == "1"
    assert analysis.repeat_gpu_ids({"gpu_ids": [], "status": "infeasible"}) == ""
    assert analysis.repeat_gpu_ids({"gpu_ids": [], "status": "ok", "repeats": [{"repeat": 0, "gpu_ids": []}]}) == ""


def test_each_saved_repeat_records_the_gpus_it_ran_on(tmp_path: Path) -> None:
    job = _job(tmp_path, batch_sizes=[1], repeats=1)
    (p,) = _points(tmp_path, job)
    p.head["gpu_ids"] = ["3"]
    jr = Journal("m")
    runner.measure_points([p], StandInMeasurer(), 1, None, jr, keep_saved=True)
    (saved,) = jr.load(p.paths, p.meta_run())
    assert saved.meta["gpu_ids"] == ["3"] and saved.meta["machine"] == "m"


def test_a_repeat_without_a_machine_of_its_own_is_the_files(tmp_path: Path) -> None:
    """Replication and probe results record the machine once, in their provenance; a resumed repeat its own."""
    path = tmp_path / "opt125m_r2.parquet"
    meta = {"status": "ok", "provenance": {"machine": "h200-aaaa"},
            "repeats": [{"repeat": 0}, {"repeat": 1, "machine": "h200-bbbb"}]}  # fmt: skip
    io.write_parquet(pl.DataFrame({"repeat": [0, 1]}), path, meta)
    io.write_parquet(pl.DataFrame({"repeat": [0, 1]}), layout.telemetry_path(path), {})
    rows = analysis.repeat_rows(path, lambda m, p, models: {}, lambda req, rep, tel: {})
    assert [r["machine"] for r in rows] == ["h200-aaaa", "h200-bbbb"]
    io.write_parquet(pl.DataFrame({"repeat": [0]}), path, {**meta, "provenance": {}, "repeats": [{"repeat": 0}]})
    assert [r["machine"] for r in analysis.repeat_rows(path, lambda m, p, models: {}, lambda r, e, t: {})] == [None]


def test_discarding_leaves_a_folder_another_job_is_saving_into(tmp_path: Path, monkeypatch) -> None:
    """Two jobs share a folder (replication/, calibration/<machine>/): when one discards its saved repeats,
    a repeat the other saves meanwhile keeps ``.partial/``, and neither job fails."""
    job = _job(tmp_path)
    p, q = _points(tmp_path, job)
    Journal("m").save(p.paths, p.meta_run(), 0, stand_in_measurement(1, 0))
    real = Path.rmdir

    def other_job_saves_first(self: Path) -> None:  # the other job's file lands after any emptiness check
        Journal("m").save(q.paths, q.meta_run(), 0, stand_in_measurement(8, 0))
        real(self)

    monkeypatch.setattr(Path, "rmdir", other_job_saves_first)
    assert [f.name for f in journal.discard_saved(p.paths)] == ["bs1.r0.requests.parquet", "bs1.r0.telemetry.parquet"]
    assert journal.partial_paths(q.paths, 0)[0].exists()


def test_repeats_resume_only_on_a_server_of_the_same_batch_limit(tmp_path: Path) -> None:
    """One server per sweep (scheduler, client): its --max-num-seqs is the largest batch of the config, so
    adding b=512 changes the server that measures b=8, and b=8's saved repeats must not resume on it. A
    server per batch (restart) measures b=8 the same whatever the other batches are."""

    def key(mode: str, batches: list[int]) -> str:
        job = _job(tmp_path, batch_sizes=batches, batch_control=mode)
        return journal.settings_key(runner.Point(8, job, (tmp_path / "a", tmp_path / "b")).meta_run())

    for mode in ("scheduler", "client"):
        assert key(mode, [1, 8, 256]) != key(mode, [1, 8, 256, 512])
        assert key(mode, [1, 8, 256]) == key(mode, [8, 256])
    assert key("restart", [1, 8, 256]) == key("restart", [1, 8, 256, 512])
