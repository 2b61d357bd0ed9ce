"""A point from its repeats (analysis.points) as the figures draw it: maxima and the GPU metrics with their 95%
CI, preemptions unknown where a repeat has no count, the energy window flag of every repeat, the per-replica
latencies averaged element-wise, and a clear error for a result file whose metadata lacks a key."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from slmserve import analysis, figures, io, measure, replication, stats
from slmserve.figures import captions
from tests.test_analysis_figures import write_run
from tests.test_figures import dataset, frame, run

FIXTURE_R2 = Path(__file__).parent / "fixtures/results/replication/opt125m_r2.parquet"
Change = Callable[[pl.DataFrame, pl.DataFrame, dict[str, Any]], tuple[pl.DataFrame, pl.DataFrame, dict[str, Any]]]


def with_repeats(src: Path, out: Path, changes: list[Change]) -> Path:
    """``out``: the one-repeat result ``src`` (and its telemetry) as measure.write_point writes a point of
    ``len(changes)`` repeats, repeat ``i`` being ``src``'s requests, telemetry and repeat metadata passed
    through ``changes[i]``."""
    meta = io.read_meta(src)
    (rep,) = measure.repeats_of(meta)
    req, tel = pl.read_parquet(src), pl.read_parquet(analysis.telemetry_path(src))
    reqs, tels, reps = [], [], []
    for i, change in enumerate(changes):
        r, t, m = change(req.clone(), tel.clone(), {**rep, "repeat": i})
        reqs.append(r.with_columns(repeat=pl.lit(i, pl.Int32)))
        tels.append(t.with_columns(repeat=pl.lit(i, pl.Int32)))
        reps.append(m)
    head = {k: v for k, v in meta.items() if k not in ("load", "loads", "server_counters", "t0_mono", "telemetry")}
    meta = {**head, "status": "ok", "reason": None, "repeats": reps}
    io.write_parquet(pl.concat(tels), analysis.telemetry_path(out), meta)
    io.write_parquet(pl.concat(reqs), out, meta)
    return out


def sm_and_counter(sm: float, preemptions: float | None, after_warmup: bool = True) -> Change:
    """A repeat whose SM activity is ``sm`` % at every sample and whose vLLM counter read gave ``preemptions``
    (None: the /metrics read failed, enginemetrics.counter_delta), read after the warm-up or (as before
    2026-11-29) before it."""

    def change(req: pl.DataFrame, tel: pl.DataFrame, rep: dict[str, Any]) -> Any:
        counters = None if preemptions is None else {"vllm:num_preemptions_total": preemptions}
        rep = {k: v for k, v in rep.items() if k != "counters_after_warmup"}
        rep = {**rep, "server_counters": [counters], **({"counters_after_warmup": True} if after_warmup else {})}
        return req, tel.with_columns(sm_active_pct=pl.lit(sm)), rep

    return change


def test_a_maximum_is_the_mean_of_the_repeats_maxima_with_its_ci(tmp_path: Path) -> None:
    """Repeats whose SM activity peaks at 50, 60, 70 %: the point's max is 60 with the t-interval of the three,
    as its mean; the largest of all repeats (70) would be a statistic no caption names."""
    src = write_run(tmp_path, 4)
    path = with_repeats(src, tmp_path / "bs4x3.requests.parquet", [sm_and_counter(s, 0.0) for s in (50, 60, 70)])
    row = analysis.summarize_run(path)
    want = stats.describe([50.0, 60.0, 70.0])
    assert row["n_repeats"] == 3 and row["sm_active_max"] == pytest.approx(60.0)
    assert row["sm_active_mean"] == pytest.approx(60.0) and row["sm_active_max_n"] == 3
    assert (row["sm_active_max_ci_lo"], row["sm_active_max_ci_hi"]) == (pytest.approx(want["ci_lo"]),
                                                                        pytest.approx(want["ci_hi"]))  # fmt: skip
    for m in ("sm_occupancy_mean", "sm_occupancy_max", "dram_bw_mean", "dram_bw_max", "effective_batch"):
        assert f"{m}_ci_lo" in row, m  # every metric a figure plots carries its CI


def test_preemptions_unknown_in_one_repeat_leave_the_point_unknown(tmp_path: Path) -> None:
    """A repeat whose /metrics read failed has no count: the point's count is unknown (null), not the mean of
    the others, so that no figure calls it a point without preemptions."""
    src = write_run(tmp_path, 4)
    known = with_repeats(src, tmp_path / "known.requests.parquet", [sm_and_counter(50, p) for p in (2.0, 4.0, 0.0)])
    unknown = with_repeats(src, tmp_path / "unknown.requests.parquet",
                           [sm_and_counter(50, p) for p in (0.0, None, 0.0)])  # fmt: skip
    assert [r["preemptions"] for r in analysis.summarize_repeats(unknown)] == [0.0, None, 0.0]
    assert analysis.summarize_run(known)["preemptions"] == pytest.approx(2.0)
    assert analysis.summarize_run(unknown)["preemptions"] is None


def test_a_point_counts_preemptions_of_its_measured_requests_only_if_every_repeat_did(tmp_path: Path) -> None:
    src = write_run(tmp_path, 4)
    new = with_repeats(src, tmp_path / "new.requests.parquet", [sm_and_counter(50, 1.0) for _ in range(3)])
    mixed = with_repeats(src, tmp_path / "mixed.requests.parquet",
                         [sm_and_counter(50, 1.0, after_warmup=i != 1) for i in range(3)])  # fmt: skip
    assert [r["preemptions_measured_only"] for r in analysis.summarize_repeats(mixed)] == [True, False, True]
    assert analysis.summarize_run(new)["preemptions_measured_only"] is True
    assert analysis.summarize_run(mixed)["preemptions_measured_only"] is False


def test_a_point_reports_the_fewest_gauge_samples_behind_its_effective_batch(tmp_path: Path) -> None:
    def engine(batch: float, samples: int) -> Change:
        def change(req: pl.DataFrame, tel: pl.DataFrame, rep: dict[str, Any]) -> Any:
            return req, tel, {**rep, "engine": [{"effective_batch": batch, "gauge_samples": samples}]}

        return change

    src = write_run(tmp_path, 4)
    path = with_repeats(src, tmp_path / "g.requests.parquet", [engine(4.0, 9), engine(3.0, 2), engine(2.0, 5)])
    assert [r["gauge_samples"] for r in analysis.summarize_repeats(path)] == [9, 2, 5]
    row = analysis.summarize_run(path)
    assert row["gauge_samples"] == 2 and row["effective_batch"] == pytest.approx(3.0)


@pytest.fixture
def unknown_at_256() -> pl.DataFrame:
    """OPT-125M at 3 repeats per batch, none preempting, except b=256, where one repeat's count is unknown."""
    rows = []
    for b in (64, 128, 256):
        for i in range(3):
            rows.append({**run("opt125m", b), "path": f"bs{b}", "repeat": i,
                         "preemptions": None if (b, i) == (256, 1) else 0.0})  # fmt: skip
    return analysis.points(frame(rows))


def test_a_batch_whose_preemptions_are_unknown_is_not_chosen_as_without(unknown_at_256: pl.DataFrame) -> None:
    chart, cap = figures.power(unknown_at_256)
    assert dataset(chart)["batch_size"].to_list() == [128]
    assert "Chosen: OPT-125M: batch 128." in cap
    assert "Skipped (larger batches with preemptions or an unknown count): OPT-125M b=256 (preemption count " \
           "unknown)." in cap  # fmt: skip
    _, cap = figures.throughput_latency(unknown_at_256)
    assert "none at any plotted point" not in cap
    assert (
        "Preemptions (vLLM's counter, mean over repeats): none at the 2 points with a count. Preemption count "
        "unknown (a repeat has none: its /metrics read failed) at 1 of 3 plotted points: OPT-125M b=256." in cap
    )
    hit = unknown_at_256.with_columns(preemptions=pl.when(pl.col("batch_size") == 64).then(3.0)
                                      .otherwise(pl.col("preemptions")))  # fmt: skip
    assert (
        "mean over repeats) at 1 of 3 plotted points: OPT-125M b=64: 3. Preemption count unknown (a repeat has "
        "none: its /metrics read failed) at 1 of 3 plotted points: OPT-125M b=256."
        in figures.throughput_latency(hit)[1]
    )
    only = unknown_at_256.filter(pl.col("batch_size") == 256)  # no run known to be without: its largest batch
    _, cap = figures.power(only)
    assert "Chosen: OPT-125M: batch 256 (preemption count unknown)." in cap


def test_output_lengths_prefer_a_batch_known_to_run_without_preemptions() -> None:
    rows = [{**run("opt6.7b", b, out=64), "effective_batch": 30.0, "preemptions": p}
            for b, p in ((32, 0.0), (64, None))]  # fmt: skip
    chart, cap = figures.output_lengths(frame(rows))
    assert dataset(chart)["batch_size"].to_list() == [32]
    assert "count unknown" not in cap  # the plotted point has a count


def energy_repeats(path: str, windows: list[float]) -> list[dict[str, Any]]:
    """A point's repeat rows whose energy windows are ``windows`` (flag by analysis.energy_metrics)."""
    rows = []
    for i, w in enumerate(windows):
        energy = analysis.energy_metrics(10.0 * w, 1000, w, int(10 * w))
        rows.append({**run("opt125m", 64), "path": path, "repeat": i, **energy})
    return rows


def test_the_energy_window_flag_is_the_summarys_every_repeat_not_the_mean() -> None:
    """Windows of 9, 11 and 11 s: the mean (10.3 s) reaches 10 s, but one repeat does not; the summary's
    energy_window_ok is false and the figure draws the point hollow and names it, as for the quick profile's
    OPT-1.3B ×2 (mean window 10.09 s, flag false)."""
    summary = analysis.points(frame(energy_repeats("a", [9.0, 11.0, 11.0]) + energy_repeats("b", [12.0] * 3)))
    assert summary["energy_window_ok"].to_list() == [False, True]
    assert summary["energy_window_s"][0] == pytest.approx(31 / 3)
    summary = summary.with_columns(batch_size=pl.Series([64, 128]))
    chart, cap = figures.energy_per_token(summary)
    assert dataset(chart).sort("batch_size")["ok"].to_list() == [False, True]
    assert "Energy window per point (mean over repeats): 10.3-12.0 s, 90-120 telemetry samples (a point's fewest " \
           "over repeats)." in cap  # fmt: skip
    assert (
        "1 of 2 points have a repeat whose window is shorter than 10 s (analysis.ENERGY_MIN_WINDOW_S), too "
        "short for a trusted energy figure; drawn hollow/faded (mean window): OPT-125M b=64 (10.3 s)." in cap
    )
    assert "every repeat's window is at least" not in cap
    reps = summary.with_columns(replicas=pl.Series([2, 3]), batch_per_replica=pl.lit(64))
    chart, cap = figures.energy_per_token_replicas(reps)
    assert dataset(chart).sort("replicas")["energy_window_ok"].to_list() == [False, True]
    assert "drawn hollow/faded (mean window): OPT-125M ×2 (10.3 s)." in cap


def test_figures_draw_the_ci_of_the_gpu_metrics_and_the_effective_batch() -> None:
    """Figure 3, the DRAM figure and Figure 2 (right) from a summary of 3 repeats per point: each point's
    error bar is its 95% CI over repeats."""
    rows = []
    for b in (64, 128):
        for i, k in enumerate((0.9, 1.0, 1.1)):
            row = run("opt6.7b", b)
            scaled = {m: row[m] * k for m in ("sm_active_mean", "sm_active_max", "sm_occupancy_mean",
                                             "sm_occupancy_max", "dram_bw_mean", "dram_bw_max")}  # fmt: skip
            rows.append({**row, **scaled, "path": f"bs{b}", "repeat": i, "effective_batch": 50.0 * k})
    summary = analysis.points(frame(rows))
    want = stats.describe([0.9 * 50, 50.0, 1.1 * 50])
    for draw, panels in ((figures.sm_metrics, {"SM activity", "SM occupancy"}),
                         (figures.dram_bandwidth, {"DRAM bandwidth"})):  # fmt: skip
        chart, cap = draw(summary)
        data = dataset(chart)
        assert set(data["panel"]) == panels and data["lo"].is_not_null().all() and data["hi"].is_not_null().all()
        assert (data["lo"] < data["value"]).all() and (data["value"] < data["hi"]).all()
        assert "drawn as error bars on" in cap and "at the 2 points with n >= 2" in cap and "No CI" not in cap
    _, cap = figures.sm_metrics(summary)
    assert "error bars on SM activity, max SM activity, SM occupancy, max SM occupancy at" in cap
    assert "a point is the mean over repeats of each (for max: the repeats' maxima averaged" in cap
    chart, cap = figures.output_lengths(summary)
    right = chart.to_dict()["hconcat"][1]["layer"]
    assert right[3]["encoding"]["y"]["field"] == "effective_batch_ci_lo"
    assert right[3]["transform"] == [{"filter": "isValid(datum.effective_batch_ci_lo)"}]
    data = dataset(chart)
    assert data["batch_size"].to_list() == [128]  # the largest batch of the one point (output length, rate)
    assert data["effective_batch_ci_lo"].to_list() == pytest.approx([want["ci_lo"]])
    assert "error bars on throughput, mean latency, effective batch at 1 point with n >= 2" in cap


def shift_replica0(seconds: float) -> Change:
    """A repeat whose replica 0 ended every request ``seconds`` later."""

    def change(req: pl.DataFrame, tel: pl.DataFrame, rep: dict[str, Any]) -> Any:
        later = pl.col("replica") == 0
        req = req.with_columns(pl.when(later).then(pl.col(c) + seconds).otherwise(pl.col(c)).alias(c)
                               for c in ("end_s", "latency_s"))  # fmt: skip
        return req, tel, rep

    return change


def test_the_per_replica_latency_is_the_element_wise_mean_over_repeats(tmp_path: Path) -> None:
    """As latency_mean_s (the largest replica mean, averaged over repeats), not repeat 0's list."""
    path = with_repeats(FIXTURE_R2, tmp_path / "opt125m_r2.parquet", [shift_replica0(0.0), shift_replica0(1.0)])
    reps = replication.summarize_repeats(path)
    per = [r["latency_mean_per_replica"] for r in reps]
    assert per[1][0] == pytest.approx(per[0][0] + 1.0) and per[1][1] == pytest.approx(per[0][1])
    (row,) = replication.summarize_runs([path]).iter_rows(named=True)
    assert row["n_repeats"] == 2
    assert row["latency_mean_per_replica"] == pytest.approx([(a + b) / 2 for a, b in zip(*per, strict=True)])
    assert row["latency_mean_s"] == pytest.approx((max(per[0]) + max(per[1])) / 2)


def test_per_replica_lists_of_different_lengths_are_an_error() -> None:
    rows = frame([{"path": "x.parquet", "repeat": i, "latency_mean_per_replica": v}
                  for i, v in enumerate(([1.0, 2.0], [1.0, 2.0, 3.0]))])  # fmt: skip
    with pytest.raises(ValueError, match=r"x\.parquet: latency_mean_per_replica: the repeats hold 2 and 3 values"):
        analysis.points(rows)
    assert analysis.mean_per_position([[1.0, None], [3.0, 4.0]], "x") == [2.0, None]
    assert analysis.mean_per_position([[1.0], None], "x") is None


def test_a_result_without_a_key_names_the_file_the_key_and_what_to_do(tmp_path: Path) -> None:
    src = write_run(tmp_path, 4)
    meta, req = io.read_meta(src), pl.read_parquet(src)
    del meta["run"]["tensor_parallel"]
    io.write_parquet(req, src, meta)
    with pytest.raises(ValueError, match=r"bs4\.requests\.parquet: .* has no run\.tensor_parallel: .*re-measure"):
        analysis.summarize_repeats(src)
    del meta["provenance"]
    io.write_parquet(req, src, meta)
    every = r"bs4\.requests\.parquet: .* has no provenance, run\.tensor_parallel: .*not a slmserve result"  # both named
    with pytest.raises(ValueError, match=every):
        analysis.summarize_runs([src])
    rep = tmp_path / "opt125m_r2.parquet"  # a replication result: its own row function
    meta, req = io.read_meta(FIXTURE_R2), pl.read_parquet(FIXTURE_R2)
    del meta["run"]["replicas"]
    io.write_parquet(req, rep, meta)
    with pytest.raises(ValueError, match=r"opt125m_r2\.parquet: .* has no run\.replicas: .*re-measure"):
        replication.summarize_repeats(rep)


def test_a_metric_without_a_ci_is_named_with_the_reason() -> None:
    runs = frame([run("opt125m", 1)]).with_columns(n_repeats=pl.lit(3))
    note = captions._ci_note(runs, ["throughput_rps", "tensor_active_mean"])
    assert note == "No CI: tensor_active_mean: means over repeats, not among the metrics with a CI " \
                   "(analysis.CI_METRICS); throughput: means over repeats without a CI in this summary (summarized " \
                   "before analysis.CI_METRICS held it; re-summarize)."  # fmt: skip


def test_a_replication_result_without_its_run_is_named(tmp_path: Path) -> None:
    rep = tmp_path / "opt125m_r1.parquet"
    meta, req = io.read_meta(FIXTURE_R2), pl.read_parquet(FIXTURE_R2)
    io.write_parquet(req, rep, {k: v for k, v in meta.items() if k != "run"})
    with pytest.raises(ValueError, match=r"opt125m_r1\.parquet: the result's slmserve metadata has no run: "):
        replication.summarize_runs([rep])
