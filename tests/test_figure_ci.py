"""Repeats, 95% CIs, preemptions, energy windows and the replication throughput in the figures and
their captions: each caption states only what the summary it draws holds."""

from __future__ import annotations

import polars as pl
import pytest

from slmserve import figures
from slmserve.figures import captions
from slmserve.layout import FIGURES
from tests.test_figures import BATCHES, GPU, dataset, frame, run


def with_repeats(
    df: pl.DataFrame, n: int, metrics: tuple[str, ...] = ("throughput_rps", "latency_mean_s", "power_w_mean")
):
    """``df`` as analysis.points writes it: ``n_repeats`` and, for n >= 2, a CI of ±10% on ``metrics``."""
    out = df.with_columns(n_repeats=pl.lit(n, pl.UInt32))
    for m in metrics:
        lo = pl.col(m) * 0.9 if n > 1 else pl.lit(None, pl.Float64)
        hi = pl.col(m) * 1.1 if n > 1 else pl.lit(None, pl.Float64)
        out = out.with_columns(lo.alias(f"{m}_ci_lo"), hi.alias(f"{m}_ci_hi"))
    return out


@pytest.fixture
def sweep3() -> pl.DataFrame:
    """OPT-125M at three repeats per point, except batch 512 (one repeat); OPT-1.3B preempts at 256."""
    rows = frame([run("opt125m", b) for b in BATCHES] + [run("opt1.3b", b, preemptions=12 * (b == 256))
                                                          for b in BATCHES[:-1]])  # fmt: skip
    three = with_repeats(rows.filter((pl.col("model") == "opt125m") & (pl.col("batch_size") < 512)), 3)
    one = with_repeats(rows.filter((pl.col("model") != "opt125m") | (pl.col("batch_size") == 512)), 1)
    return pl.concat([three, one], how="diagonal_relaxed")


def test_tradeoff_draws_ci_on_both_axes_and_counts_repeats(sweep3: pl.DataFrame) -> None:
    chart, cap = figures.throughput_latency(sweep3)
    layers = chart.to_dict()["layer"]
    y_err, x_err = layers[3], layers[4]
    assert (y_err["mark"]["type"], y_err["encoding"]["y"]["field"], y_err["encoding"]["y2"]["field"]) == (
        "rule", "throughput_rps_ci_lo", "throughput_rps_ci_hi")  # fmt: skip
    assert (x_err["encoding"]["x"]["field"], x_err["encoding"]["x2"]["field"]) == (
        "latency_mean_s_ci_lo", "latency_mean_s_ci_hi")  # fmt: skip
    assert y_err["transform"] == [{"filter": "isValid(datum.throughput_rps_ci_lo)"}]
    data = dataset(chart)
    b64 = data.filter((pl.col("model") == "OPT-125M") & (pl.col("batch_size") == 64)).row(0, named=True)
    assert b64["throughput_rps_ci_lo"] == pytest.approx(0.9 * b64["throughput_rps"])
    assert data.filter(pl.col("model") == "OPT-1.3B")["throughput_rps_ci_lo"].is_null().all()
    assert "Repeats: n = 1 at 10 of 19 points; 9 points with n = 3: OPT-125M b=1, OPT-125M b=2," in cap
    assert "Student's t over repeats" in cap
    assert "error bars on throughput, mean latency at the 9 points with n >= 2" in cap
    assert "Preemptions (vLLM's counter, mean over repeats) at 1 of 19 plotted points: OPT-1.3B b=256: 12." in cap


def test_single_repeat_summaries_say_there_is_no_ci(sweep3: pl.DataFrame) -> None:
    one = with_repeats(frame([run("opt125m", b) for b in (1, 2, 4)]), 1)
    _, cap = figures.throughput_latency(one)
    assert "Repeats: n = 1 per point (3 points)." in cap
    assert "none drawn, no plotted point has n >= 2" in cap
    assert "Preemptions (vLLM's counter, mean over repeats): none at any plotted point." in cap
    _, cap = figures.throughput_latency(frame([run("opt125m", 1)]))  # an old summary without n_repeats
    assert "Repeats per point: not recorded in this summary." in cap


def test_one_point_is_named_in_the_singular() -> None:
    """OPT-125M's paper sweep (2026-11-24): n = 3 at 9 points and n = 2 at b=1, the only one."""
    rows = frame([run("opt125m", b) for b in (1, 2, 4)])
    two = with_repeats(rows.filter(pl.col("batch_size") == 1), 2)
    _, cap = figures.throughput_latency(pl.concat([two, with_repeats(rows.filter(pl.col("batch_size") > 1), 1)]))
    assert "Repeats: n = 1 at 2 of 3 points; 1 point with n = 2: OPT-125M b=1." in cap
    assert "error bars on throughput, mean latency at 1 point with n >= 2" in cap
    _, cap = figures.throughput_latency(two)
    assert "Repeats: n = 2 per point (1 point)." in cap


def test_batch_figures_carry_the_ci_where_the_metric_has_one(sweep3: pl.DataFrame) -> None:
    chart, cap = figures.util_throughput(sweep3)
    panel = chart.to_dict()["hconcat"][1]
    assert panel["layer"][2]["encoding"]["y"]["field"] == "lo" and panel["layer"][2]["encoding"]["y2"]["field"] == "hi"
    data = dataset(chart)
    thr = data.filter((pl.col("panel") == "Throughput") & (pl.col("model") == "OPT-125M")).sort("batch_size")
    assert thr["lo"].to_list()[:9] == pytest.approx([0.9 * v for v in thr["value"].to_list()[:9]])
    assert thr["lo"].to_list()[9] is None and data.filter(pl.col("panel") == "GPU utilisation")["lo"].is_null().all()
    assert "error bars on throughput at the 9 points with n >= 2; GPU utilisation: means over repeats without a CI " \
           "in this summary (summarized before analysis.CI_METRICS held it; re-summarize)." in cap  # fmt: skip
    _, cap = figures.sm_metrics(sweep3)  # a summary made before these metrics had a CI says so
    assert "No CI: SM activity, max SM activity, SM occupancy, max SM occupancy: means over repeats without a CI " \
           "in this summary (summarized before analysis.CI_METRICS held them; re-summarize)." in cap  # fmt: skip
    assert "not among the metrics with a CI" not in cap


def test_power_bars_ci_rule_and_skipped_points(sweep3: pl.DataFrame) -> None:
    chart, cap = figures.power(sweep3)
    layers = chart.to_dict()["layer"]
    assert layers[2]["encoding"]["y"]["field"] == "power_w_mean_ci_lo"
    assert dataset(chart).sort("model")["batch_size"].to_list() == [128, 512]
    assert "the largest batch without preemptions (the no-preemption rule applied to the measured runs; a run " \
           "whose count is unknown does not count as without)" in cap  # fmt: skip
    assert "Chosen: OPT-125M: batch 512, OPT-1.3B: batch 128." in cap
    assert "Skipped (larger batches with preemptions): OPT-1.3B b=256 (12 preemptions)." in cap
    all_preempt = sweep3.filter(pl.col("model") == "opt1.3b", pl.col("batch_size") == 256)
    assert "Chosen: OPT-1.3B: batch 256 (12 preemptions)." in figures.power(all_preempt)[1]
    with_rule = sweep3.with_columns(fits=pl.lit("admission"))
    assert "(the sweep's configured fit rule, engine.fits: admission)" in figures.power(with_rule)[1]


def test_captions_hold_no_measured_claim_of_past_runs(sweep3: pl.DataFrame) -> None:
    client = sweep3.with_columns(batch_control=pl.lit("client"))
    for name in ("throughput_latency", "sm_metrics", "power", "util_throughput", "energy_per_token"):
        cap = FIGURES[name].draw(client)[1]
        assert "client-side concurrency limit" in cap
        assert "7-20%" not in cap and "on an H100 this measured" not in cap, name


@pytest.fixture
def replication() -> pl.DataFrame:
    rows = []
    for model, system, total, window in (("opt125m", (187.6, 205.7, 219.4), (187.6, 218.1, 229.1), 2.5),
                                         ("opt2.7b", (25.0, 21.8, 19.6), (25.0, 21.9, 19.7), 20.0)):  # fmt: skip
        for n in (1, 2, 3):
            rows.append({
                "model": model, "family": "OPT", "params": model[3:].upper(), "replicas": n, "status": "ok",
                "batch_per_replica": 512 // n, "gpu_model": GPU, "engine": "vllm", "engine_version": "0.26.0",
                "input_len": 512, "output_len": 256, "n_ok": 500, "throughput_rps": system[n - 1],
                "throughput_sum_rps": total[n - 1], "latency_mean_s": 3.0 + n, "power_w_mean": 400.0 + n,
                "gpu_util_mean": 80.0, "energy_per_token_j": 0.01 * n, "energy_window_s": window * n,
                "energy_window_ok": window * n >= 10, "energy_samples": int(10 * window * n),
                "preemptions": 62.0 if (model, n) == ("opt2.7b", 3) else 0.0,
            })  # fmt: skip
    return with_repeats(frame(rows), 1, ("throughput_rps", "latency_mean_s", "power_w_mean", "energy_per_token_j"))


def test_replication_says_which_throughput_it_plots(replication: pl.DataFrame) -> None:
    chart, cap = figures.replication_tradeoff(replication)
    assert dataset(chart).filter(pl.col("model") == "OPT-125M").sort("replicas")["throughput_rps"].to_list() == [
        187.6, 205.7, 219.4]  # fmt: skip
    assert "Throughput plotted: the system throughput" in cap and "throughput_sum_rps" in cap
    assert "System throughput / sum of per-replica rates (req/s): OPT-125M: ×1 187.6 / 187.6, ×2 205.7 / 218.1, " \
           "×3 219.4 / 229.1; OPT-2.7B: ×1 25.0 / 25.0" in cap  # fmt: skip
    assert "throughput = sum over replicas" not in cap
    assert "Preemptions (vLLM's counter, mean over repeats) at 1 of 6 plotted points: OPT-2.7B ×3: 62." in cap


def test_energy_captions_state_the_window_and_name_short_ones(replication: pl.DataFrame, sweep3) -> None:
    chart, cap = figures.energy_per_token_replicas(replication)
    assert "Energy window per point (mean over repeats): 2.5-60.0 s, 25-600 telemetry samples" in cap
    assert "3 of 6 points have a repeat whose window is shorter than 10 s" in cap
    assert "OPT-125M ×1 (2.5 s), OPT-125M ×2 (5.0 s), OPT-125M ×3 (7.5 s)" in cap
    bars = chart.to_dict()["layer"][0]["encoding"]
    assert bars["opacity"]["condition"]["test"] == "datum.energy_window_ok !== true"
    assert dataset(chart).sort("model", "replicas")["energy_window_ok"].to_list() == [False] * 3 + [True] * 3
    windows = sweep3.with_columns(energy_window_s=pl.col("batch_size").cast(pl.Float64),
                                  energy_window_ok=pl.col("batch_size") >= 10,
                                  energy_samples=pl.col("batch_size") * 10)  # fmt: skip
    chart, cap = figures.energy_per_token(windows)
    data = dataset(chart)
    assert data.filter(pl.col("batch_size") < 10)["ok"].to_list() == [False] * 8
    assert chart.to_dict()["layer"][3]["transform"][-1] == {"filter": "datum.ok !== true"}
    assert "8 of 19 points have a repeat whose window is shorter than 10 s" in cap and "OPT-1.3B b=8 (8.0 s)" in cap
    # a summary without the flag: not known to be trusted, drawn as not trusted and named
    chart, cap = figures.energy_per_token(windows.drop("energy_window_ok"))
    assert dataset(chart)["ok"].is_null().all()
    assert "19 of 19 points do not record whether every repeat's window reached 10 s" in cap
    assert "every repeat's window is at least" not in cap
    _, cap = figures.energy_per_token(windows.with_columns(energy_window_ok=pl.lit(True)))
    assert "every repeat's window is at least 10 s (analysis.ENERGY_MIN_WINDOW_S)." in cap


def test_a_latency_interval_below_zero_leaves_the_log_axis_intact() -> None:
    """OPT-125M's paper sweep (2026-11-25): b=1 has n = 2 on two machines, mean latency 140.8 s with the 95%
    CI [-1.6, 283.3]; drawn on the log axis, that one bar left Figure 1 without an x scale."""
    rows = with_repeats(frame([run("opt125m", b) for b in (1, 2, 4)]), 2)
    rows = rows.with_columns(latency_mean_s_ci_lo=pl.when(pl.col("batch_size") == 1).then(-1.6)
                             .otherwise(pl.col("latency_mean_s_ci_lo")))  # fmt: skip
    chart, cap = figures.throughput_latency(rows)
    x_err = chart.to_dict()["layer"][4]
    assert x_err["transform"] == [{"filter": "isValid(datum.latency_mean_s_ci_lo) && datum.latency_mean_s_ci_lo > 0"}]
    assert "CI of mean latency reaches zero or below at OPT-125M b=1 (n = 2): the log axis cannot draw it" in cap
    _, cap = figures.throughput_latency(rows.with_columns(latency_mean_s_n=pl.lit(1).cast(pl.UInt32)))
    assert "zero or below at OPT-125M b=1 (n = 1)" in cap  # the latency's own count of values, not the repeats'
    _, cap = figures.throughput_latency(with_repeats(frame([run("opt125m", b) for b in (1, 2)]), 2))
    assert "reaches zero or below" not in cap


ENERGY = ("energy_per_token_j",)


def test_an_energy_interval_below_zero_leaves_the_log_axis_intact() -> None:
    """Two repeats of 1.0 and 1.5 J give the CI [-1.93, 4.43]: drawn on the energy figure's log axis, that one
    bar pushed every point to the top edge and dropped the axis."""
    rows = with_repeats(frame([run("opt125m", b) for b in (1, 2, 4)]), 2, ENERGY)
    rows = rows.with_columns(energy_per_token_j_ci_lo=pl.when(pl.col("batch_size") == 2).then(-1.93)
                             .otherwise(pl.col("energy_per_token_j_ci_lo")))  # fmt: skip
    chart, cap = figures.energy_per_token(rows)
    errors = chart.to_dict()["layer"][2]
    assert errors["mark"]["type"] == "rule"
    assert errors["transform"][-1] == {"filter": "isValid(datum.lo) && datum.lo > 0"}
    assert "CI of energy per token reaches zero or below at OPT-125M b=2 (n = 2): the log axis cannot draw it" in cap
    _, cap = figures.energy_per_token(with_repeats(frame([run("opt125m", b) for b in (1, 2)]), 2, ENERGY))
    assert "reaches zero or below" not in cap


def test_preemption_means_are_rounded_to_one_decimal() -> None:
    runs = pl.DataFrame({"model": ["a", "b", "c"], "preemptions": [209 / 3, 118.0, 0.0],
                         "preemptions_measured_only": [True] * 3})  # fmt: skip
    note = captions._preemption_note(runs, name=lambda r: r["model"])
    assert note == "Preemptions (vLLM's counter, mean over repeats) at 2 of 3 plotted points: a: 69.7; b: 118."


def test_counts_that_include_the_warmup_are_named_upper_bounds() -> None:
    """Results written before the counters were read after the warm-up (flag false, or no flag in the
    summary) give at most the measured requests' count; a 0 stays exact and needs no warning."""
    runs = pl.DataFrame({"model": ["a", "b", "c"], "preemptions": [7.0, 118.0, 0.0],
                         "preemptions_measured_only": [True, False, False]})  # fmt: skip
    note = captions._preemption_note(runs, name=lambda r: r["model"])
    assert note == (
        "Preemptions (vLLM's counter, mean over repeats) at 2 of 3 plotted points: a: 7; b: 118. Counted with the "
        "warm-up's requests at 1 of them (results written before 2026-11-29 read vLLM's counter before the "
        "warm-up): at most, not exactly, the measured requests' count."
    )
    note = captions._preemption_note(runs.drop("preemptions_measured_only"), name=lambda r: r["model"])
    assert "Counted with the warm-up's requests at 2 of them" in note


def test_power_rule_warns_of_counts_with_the_warmup(sweep3: pl.DataFrame) -> None:
    old = sweep3.with_columns(preemptions_measured_only=pl.col("batch_size") != 256)
    assert "(12 preemptions). Counted with the warm-up's requests at 1 of them" in figures.power(old)[1]
    assert "Counted with the warm-up" not in figures.power(sweep3)[1]
