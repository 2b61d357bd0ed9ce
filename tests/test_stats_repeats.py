"""Repeats and their statistics: the t-interval, the ratio of means, the repeat rule, a point's summary
from its repeats, and vLLM's counters around a run."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from scipy import stats as st

from slmserve import analysis, enginemetrics, stats
from slmserve.runner import wants_repeat


def test_describe_is_the_student_t_interval() -> None:
    xs = [10.0, 12.0, 11.0, 13.0]
    d = stats.describe(xs)
    lo, hi = st.t.interval(0.95, len(xs) - 1, loc=11.5, scale=st.sem(xs))
    assert d["n"] == 4 and d["mean"] == pytest.approx(11.5) and d["sd"] == pytest.approx(math.sqrt(5 / 3))
    assert (d["ci_lo"], d["ci_hi"]) == (pytest.approx(lo), pytest.approx(hi))
    one = stats.describe([3.0, None])
    assert one["n"] == 1 and one["mean"] == 3.0 and one["ci_lo"] is None  # one repeat: no interval
    assert stats.describe([])["n"] == 0


def test_a_value_that_is_not_finite_stops_the_summary_naming_the_point_and_metric() -> None:
    """A NaN left out of the interval but kept in the mean gave a point whose mean and CI came from different
    samples (repeats 10, 11, NaN: mean NaN, CI [4.15, 16.85] over two)."""
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match=r"value (nan|inf) at position 2 of 3 non-null values is not finite"):
            stats.describe([10.0, None, 11.0, bad])
    rows = pl.DataFrame({"path": ["runs/x/bs4.requests.parquet"] * 3, "repeat": [0, 1, 2],
                         "throughput_rps": [10.0, 11.0, math.nan]})  # fmt: skip
    with pytest.raises(ValueError, match=r"^runs/x/bs4.requests.parquet: throughput_rps: value nan at position 2"):
        analysis.points(rows)


def test_ratio_ci_brackets_the_ratio_and_narrows_with_agreement() -> None:
    r = stats.ratio_ci([100.0, 102.0, 98.0], [50.0, 51.0, 49.0])
    assert r["ratio"] == pytest.approx(2.0) and r["ci_lo"] < 2.0 < r["ci_hi"]
    wide = stats.ratio_ci([100.0, 130.0, 70.0], [50.0, 51.0, 49.0])
    assert wide["ci_hi"] - wide["ci_lo"] > r["ci_hi"] - r["ci_lo"]
    assert stats.ratio_ci([1.0], [1.0, 2.0])["ci_lo"] is None


def test_verdict_follows_the_interval() -> None:
    assert stats.verdict(0.994, 1.039, 0.03) == "agree"  # contains 1, half-width 2.25%
    assert stats.verdict(0.97, 1.03, 0.03) == "agree"  # the boundary is inside
    assert stats.verdict(0.948, 1.023, 0.03) == "inconclusive"  # contains 1, half-width 3.75%
    assert stats.verdict(1.041, 1.088, 0.03) == "differ" and stats.verdict(0.90, 0.99, 0.5) == "differ"
    assert stats.verdict(None, None, 0.03) == "inconclusive"  # one repeat: no interval, no verdict


def test_repeat_rule_counts_and_budget() -> None:
    assert wants_repeat([], 3, 10)  # the first always runs, however long
    assert wants_repeat([100.0], 3, None) and not wants_repeat([1.0, 1.0, 1.0], 3, None)
    assert wants_repeat([200.0], 3, 600) and wants_repeat([200.0, 200.0], 3, 600)  # 400 + 200 <= 600
    assert not wants_repeat([250.0, 250.0], 3, 600)  # the third would end at 750 s
    assert not wants_repeat([700.0], 3, 600)


def test_a_point_is_the_mean_of_its_repeats_with_worst_counts_and_mean_maxima() -> None:
    rows = pl.DataFrame({
        "path": ["a", "a", "a", "b"], "repeat": [0, 1, 2, None], "model": ["m"] * 4,
        "throughput_rps": [10.0, 12.0, 11.0, None], "sm_active_max": [50.0, 70.0, 60.0, None],
        "n_ok": [500, 499, 500, None], "client_ok": [True, False, True, None], "status": ["ok"] * 3 + ["infeasible"],
        "energy_samples": [81, 79, 80, None], "n_error": [0, 1, 0, None],
    })  # fmt: skip
    p = analysis.points(rows).sort("path")
    a, b = p.row(0, named=True), p.row(1, named=True)
    assert a["n_repeats"] == 3 and a["throughput_rps"] == pytest.approx(11.0)
    assert a["throughput_rps_ci_lo"] < 11.0 < a["throughput_rps_ci_hi"]
    assert a["sm_active_max"] == pytest.approx(60.0)  # the repeats' maxima averaged, not the largest
    assert a["n_ok"] == 499 and a["client_ok"] is False
    assert a["energy_samples"] == 79 and a["n_error"] == 1  # any other count: the smallest, not repeat 0's
    assert b["n_repeats"] == 0 and b["client_ok"] is None and b["throughput_rps"] is None


def test_counters_of_a_run_need_both_reads() -> None:
    assert enginemetrics.counter_delta({"vllm:x_total": 5.0}, {"vllm:x_total": 8.0, "vllm:y_total": 1.0}) == {
        "vllm:x_total": 3.0, "vllm:y_total": 1.0}  # fmt: skip
    assert enginemetrics.counter_delta({}, {"vllm:x_total": 8.0}) is None  # a failed read before the run
    text = (
        '# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total{engine="0"} 3.0\n'
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 8.0\n'
    )
    assert enginemetrics.counters(text) == {"vllm:num_preemptions_total": 3.0}
    assert enginemetrics.parse(text)["vllm:num_requests_running"] == 8.0
    samples = [(0.5, 4.0, 0.0), (1.5, 8.0, 0.0), (2.5, 6.0, 0.0), (9.0, 1.0, 0.0)]
    eb = enginemetrics.effective_batch(samples, 1.0, 3.0)
    assert eb == {"effective_batch": 7.0, "running_max": 8.0, "gauge_samples": 2}


def test_ratio_ci_from_a_summarys_n_mean_and_sd_is_that_of_the_samples() -> None:
    a, b = [10.0, 11.0, 12.5], [8.0, 8.5, 9.0, 8.2]
    from_samples = stats.ratio_ci(a, b)
    assert stats.ratio_ci_of(stats.describe(a), stats.describe(b)) == pytest.approx(from_samples)
    assert stats.ratio_ci_of({"n": 1, "mean": 2.0, "sd": None}, stats.describe(b))["ci_lo"] is None  # one repeat
    assert stats.ratio_ci_of({"n": 3, "mean": None, "sd": None}, stats.describe(b))["ratio"] is None


def test_equivalence_needs_the_whole_interval_inside_the_bounds() -> None:
    assert stats.equivalent(1.002, 1.018, 0.02) is True  # a resolved 1% difference is still within 2%
    assert stats.verdict(1.002, 1.018, 0.02) == "differ"
    assert stats.equivalent(0.985, 1.025, 0.02) is False  # contains 1, half-width 2%, but reaches 2.5%
    assert stats.verdict(0.985, 1.025, 0.02) == "agree"
    assert stats.equivalent(0.98, 1.02, 0.02) is True  # the bounds are inside
    assert stats.equivalent(None, None, 0.02) is None


def test_a_difference_beyond_the_tolerance_needs_the_whole_interval_outside() -> None:
    assert stats.beyond(1.031, 1.06, 0.03) is True and stats.beyond(0.90, 0.969, 0.03) is True
    assert stats.beyond(1.02, 1.06, 0.03) is False  # resolved, but it may be under 3%
    assert stats.beyond(0.95, 1.05, 0.03) is False and stats.beyond(None, 1.0, 0.03) is None


def test_a_point_resumed_on_another_server_reports_the_kv_cache_every_repeat_had() -> None:
    run = {"model": "opt2.7b", "tensor_parallel": 1, "batch_size": 256, "output_len": 256, "input_len": 512,
           "arrival_rate": float("inf"), "batch_control": "scheduler"}  # fmt: skip
    meta = {"run": run, "provenance": {}, "status": "ok",
            "repeats": [{"repeat": 0, "servers": [{"kv_cache_tokens": 215_392}]},
                        {"repeat": 1, "servers": [{"kv_cache_tokens": 215_360}]}]}  # fmt: skip
    assert analysis._run_row(meta, "p", None)["kv_cache_tokens"] == 215_360  # not repeat 0's server


def test_a_metric_missing_in_one_repeat_counts_its_own_values_and_the_caption_says_so() -> None:
    """Power missing in one of three repeats: its CI is over 2 values, and the summary and caption say n = 2."""
    from slmserve.figures import captions

    rows = pl.DataFrame({
        "path": ["a"] * 3 + ["b"] * 3, "repeat": [0, 1, 2] * 2, "model": ["opt1.3b"] * 6,
        "batch_size": [8] * 3 + [16] * 3, "tp": [1] * 6,
        "throughput_rps": [10.0, 12.0, 11.0, 20.0, 21.0, 22.0],
        "power_w_mean": [300.0, None, 310.0, 400.0, 410.0, 405.0],
    })  # fmt: skip
    a, b = analysis.points(rows).sort("path").iter_rows(named=True)
    assert b["power_w_mean_n"] == 3
    assert a["n_repeats"] == 3 and a["throughput_rps_n"] == 3 and a["power_w_mean_n"] == 2
    lo, hi = st.t.interval(0.95, 1, loc=305.0, scale=st.sem([300.0, 310.0]))
    assert (a["power_w_mean_ci_lo"], a["power_w_mean_ci_hi"]) == (pytest.approx(lo), pytest.approx(hi))
    note = captions._ci_note(analysis.points(rows), ["power_w_mean"])
    assert "Fewer values than repeats" in note and "(n = 2 of 3)" in note and "b=16" not in note
    assert "Fewer values" not in captions._ci_note(analysis.points(rows), ["throughput_rps"])
    named = captions._ci_note(analysis.points(rows), ["power_w_mean"], lambda r: f"point {r['path']}")
    assert "power at point a (n = 2 of 3)" in named.lower()  # the figure's own names for its points
    none = rows.with_columns(power_w_mean=pl.lit(None, pl.Float64))  # no repeat has it: not drawn, not "fewer"
    assert "Fewer values" not in captions._ci_note(analysis.points(none), ["power_w_mean"])
    both = captions._ci_note(analysis.points(none), ["throughput_rps", "power_w_mean"])
    assert "drawn as error bars on throughput at the 2 points" in both  # not "on throughput, power"
    assert "power: no CI at any point (fewer than 2 values)" in both


def test_summary_sample_counts_the_repeats_with_a_value() -> None:
    """A summary row's n for a ratio is the metric's own count: a repeat without a value narrows no interval."""
    row = {"n_repeats": 3, "throughput_rps_n": 2, "throughput_rps": 10.0, "throughput_rps_sd": 1.0}
    assert stats.summary_sample(row) == {"n": 2, "mean": 10.0, "sd": 1.0}
    assert stats.summary_sample({"n_repeats": 3, "latency_mean_s": 2.0}, "latency_mean_s")["n"] == 3  # older rows
    assert stats.summary_sample({"throughput_rps": 1.0})["n"] == 1


def test_repeats_for_is_the_first_n_whose_interval_is_narrow_enough() -> None:
    def half(k: int) -> float:
        return float(st.t.ppf(0.975, k - 1)) * 0.1 / math.sqrt(k)

    n = stats.repeats_for(0.1, 0.02)
    assert n is not None and half(n) <= 0.02 < half(n - 1)
    assert n == 99  # (1.984 x 0.1 / 0.02)^2 = 98.4
    assert stats.repeats_for(0.0, 0.02) == 2
    assert stats.repeats_for(None, 0.02) is None
    assert stats.repeats_for(10.0, 0.001, limit=1000) is None


def test_repeats_inside_leaves_the_bound_what_the_mean_has_not_used() -> None:
    assert stats.repeats_inside(1.0, 0.1, 0.02) == stats.repeats_for(0.1, 0.02) == 99
    assert stats.repeats_inside(1.01, 0.1, 0.02) == stats.repeats_for(0.1, 0.01)  # 0.02 - 0.01 left
    assert stats.repeats_inside(0.99, 0.1, 0.02) == stats.repeats_inside(1.01, 0.1, 0.02) > 99 * 3
    assert stats.repeats_inside(1.02, 0.1, 0.02) is None  # at the bound: no n puts the interval inside
    assert stats.repeats_inside(0.97, 0.1, 0.02) is None
    assert stats.repeats_inside(None, 0.1, 0.02) is None and stats.repeats_inside(1.0, None, 0.02) is None


def test_between_groups_is_the_alexander_govern_test_of_the_groups() -> None:
    values, groups = [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 9.0], ["a", "a", "a", "b", "b", "b", "lone"]
    got = stats.between_groups(values, groups)
    want = st.alexandergovern([1.0, 2.0, 3.0], [4.0, 6.0, 8.0])  # the group of one value tells no spread
    assert (got["statistic"], got["p"]) == (pytest.approx(want.statistic), pytest.approx(want.pvalue))
    assert (got["n"], got["groups"]) == (6, 2)
    assert got["means"] == {"a": 2.0, "b": 6.0} and got["counts"] == {"a": 3, "b": 3}
    # unlike the F test it weights each mean by its own spread: b's SD twice a's gives another p
    assert got["p"] != pytest.approx(st.f_oneway([1.0, 2.0, 3.0], [4.0, 6.0, 8.0]).pvalue)
    close = stats.between_groups([1.0, 2.0, 3.0, 0.1, 2.1, 4.1], [0, 0, 0, 1, 1, 1])  # means 0.1 apart, SDs 1, 2
    assert close["statistic"] < 0.01 and close["p"] > 0.9
    moved = stats.between_groups([1.0, 2.0, 3.0, 1.5, 2.5, 3.5, 1.0, 2.0, 4.0], [0, 0, 0, 1, 1, 1, 2, 2, 2])
    shifted = stats.between_groups(
        [v + 10 for v in (1.0, 2.0, 3.0, 1.5, 2.5, 3.5, 1.0, 2.0, 4.0)], [0] * 3 + [1] * 3 + [2] * 3
    )
    assert moved["p"] == pytest.approx(shifted["p"]) and 0.0 < moved["p"] < 1.0


@pytest.mark.parametrize(("group_stat", "keys"), [(stats.between_groups, ("statistic", "p")),
                                                   (stats.across_groups, ("mean", "ci_lo"))])  # fmt: skip
def test_group_statistics_give_none_without_two_groups_or_spread(group_stat, keys: tuple[str, str]) -> None:
    """between_groups and across_groups keep the same groups (``stats._kept_groups``) and give nothing alike."""
    assert group_stat([1.0, 2.0, 3.0], ["a"] * 3)[keys[0]] is None
    flat = group_stat([1.0, 1.0, 2.0, 3.0], ["a", "a", "b", "b"])
    assert (flat[keys[0]], flat[keys[1]], flat["groups"]) == (None, None, 2)
    with pytest.raises(ValueError, match="3 values against 2 group labels"):
        group_stat([1.0, 2.0, 3.0], ["a", "b"])


def _random_effects(groups: list[list[float]], tau2: float) -> tuple[float, float, float]:
    """At ``tau2``: the random-effects mean, its Hartung-Knapp half-width (scale at least 1) and the
    generalized Q (``k - 1`` at Paule-Mandel's ``tau2`` when that is above 0), from the formulas."""
    m = np.array([np.mean(g) for g in groups])
    ws = 1 / (np.array([np.var(g, ddof=1) / len(g) for g in groups]) + tau2)
    mean = (ws * m).sum() / ws.sum()
    q = (ws * (m - mean) ** 2).sum()
    k = len(groups)
    return mean, st.t.ppf(0.975, k - 1) * np.sqrt(max(1.0, q / (k - 1)) / ws.sum()), q


def test_across_groups_is_paule_mandel_with_a_hartung_knapp_interval() -> None:
    a, b, c = [0.97, 0.98, 0.975, 0.972], [1.01, 1.05, 0.99, 1.03, 1.02], [1.0, 1.04, 0.96]
    got = stats.across_groups(a + b + c + [5.0], ["a"] * 4 + ["b"] * 5 + ["c"] * 3 + ["lone"])
    mean, half, q = _random_effects([a, b, c], got["tau"] ** 2)
    assert (got["n"], got["groups"]) == (12, 3)  # the group of one value tells no spread
    assert got["tau"] > 0 and q == pytest.approx(2, rel=1e-4)  # Paule-Mandel's tau2 sets the generalized Q to k - 1
    assert got["mean"] == pytest.approx(mean) and 0 < got["i2"] < 1
    assert (got["ci_lo"], got["ci_hi"]) == (pytest.approx(mean - half), pytest.approx(mean + half))
    # machines that differ widen it past the CI of every value as one sample
    one = st.t.interval(0.95, 11, loc=np.mean(a + b + c), scale=st.sem(a + b + c))
    assert got["ci_hi"] - got["ci_lo"] > one[1] - one[0]


def test_across_groups_of_alike_groups_has_no_spread_between_them() -> None:
    a, b = [1.0, 2.0, 3.0, 4.0], [1.1, 2.1, 2.9, 4.1]
    got = stats.across_groups(a + b, [0] * 4 + [1] * 4)
    mean, half, q = _random_effects([a, b], 0.0)
    assert got["tau"] == 0.0 and got["i2"] == 0.0 and q < 1  # less spread than chance
    assert got["mean"] == pytest.approx(mean)
    assert got["ci_hi"] - got["ci_lo"] == pytest.approx(2 * half)
