"""The host's part of a result: which CPU it was (CPUID), how fast its Python runs, and how much CPU time the
hypervisor took during the measured requests (steal), from provenance to the calibration table."""

from __future__ import annotations

import itertools
import math
import shutil
import threading
from collections import namedtuple
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from scipy import stats as st

from slmserve import analysis, calibration, io, measure, provenance, stats, telemetry
from tests.test_beside import StandInServer, _no_requests

ROOT = Path(__file__).resolve().parents[1]
POINT = ROOT / "results/quick/runs/opt1.3b/tp1-out256-rateinf/bs256"  # 3 repeats on an H100, 2026-11-23
Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice", defaults=(0, 0))


def test_cpu_id_is_vendor_and_cpuid_family_model_stepping(monkeypatch: pytest.MonkeyPatch) -> None:
    guest = {"vendor_id": "GenuineIntel", "cpu family": "6", "model": "207", "stepping": "2", "cpu MHz": "2100.000",
             "model name": "Intel(R) Xeon(R) Processor"}  # fmt: skip
    monkeypatch.setattr(provenance, "_cpuinfo", lambda: guest)
    assert provenance.cpu_id() == "GenuineIntel 6/207/2" and provenance.cpu_mhz() == 2100.0
    monkeypatch.setattr(provenance, "_cpuinfo", dict)  # no /proc/cpuinfo (macOS)
    assert provenance.cpu_id() is None and provenance.cpu_mhz() is None


def test_cpuinfo_is_the_first_processor_of_this_linux_host() -> None:
    info = provenance._cpuinfo()
    assert info["processor"] == "0" and provenance.cpu_id() is not None


def test_host_speed_is_the_fastest_timing_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def timed(work: Any, number: int, repeat: int) -> list[float]:
        calls.append((work(), number, repeat))
        return [0.5, 0.2, 0.3]

    provenance.host_speed_ms.cache_clear()
    monkeypatch.setattr(provenance.timeit, "repeat", timed)
    try:
        assert provenance.host_speed_ms(10, 3) == pytest.approx(20.0)  # 1000 * 0.2 s / 10 calls
        assert calls == [(provenance._host_work(), 10, 3)]
    finally:
        provenance.host_speed_ms.cache_clear()
    assert provenance.host_speed_ms() > 0


def test_every_result_records_the_host_cpu_id_and_speed() -> None:
    prov = provenance.collect({"x": 1}, ())
    assert prov["cpu_id"] == provenance.cpu_id() and prov["host_speed_ms"] > 0
    assert "cpu_mhz" in prov


def test_steal_is_the_share_of_wanted_cpu_time_given_to_other_guests() -> None:
    # Linux's user already holds guest time (guest_nice: nice): counting them again would dilute the share
    before = Times(user=10, nice=0, system=5, idle=100, iowait=1, irq=0, softirq=0, steal=1, guest=2, guest_nice=1)
    after = Times(user=40, nice=0, system=15, idle=900, iowait=9, irq=0, softirq=0, steal=11, guest=22, guest_nice=6)
    assert telemetry.steal_frac(before, after) == pytest.approx(10 / (10 + 30 + 10))  # idle and iowait left out
    assert telemetry.steal_frac(before, before) is None  # no CPU time passed
    assert telemetry.steal_frac(None, after) is None and telemetry.steal_frac(before, None) is None
    NoSteal = namedtuple("NoSteal", "user nice system idle")  # macOS
    assert telemetry.steal_frac(NoSteal(1, 0, 1, 1), NoSteal(2, 0, 2, 2)) is None


def test_a_repeat_records_the_steal_of_its_measured_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read when the first load's warm-up is over (on_measure) and when the loads end: the warm-up's steal
    (all of it stolen here, made up and named as such) is left out, and the second load's end of warm-up
    does not restart the window."""
    host = {"t": Times(0, 0, 0, 0, 0, 0, 0, 0)}
    monkeypatch.setattr(telemetry, "host_cpu_times", lambda: host["t"])

    def spend(busy: float, steal: float) -> None:
        t = host["t"]
        host["t"] = t._replace(user=t.user + busy, steal=t.steal + steal)

    def warm_up_then_measure(servers: Any, specs: Any, where: str, on_measure: Any) -> list:
        for f in on_measure:
            spend(0, 50)  # each load's warm-up
            f()
            spend(40, 10)  # measured
        return _no_requests() * len(servers)

    monkeypatch.setattr(measure, "_run_loads", warm_up_then_measure)
    m = measure.measure([StandInServer(), StandInServer()], [None, None], [], interval_s=1.0, sample=False,  # type: ignore[list-item]
                        where="")  # fmt: skip
    assert m.meta["host_steal_frac"] == pytest.approx((50 + 20) / (50 + 20 + 80))  # from the first end of warm-up

    def no_measured_phase(*_a: object) -> list:
        spend(40, 10)
        return _no_requests()

    monkeypatch.setattr(measure, "_run_loads", no_measured_phase)  # no load reached its measured phase
    m = measure.measure([StandInServer()], [None], [], interval_s=1.0, sample=False, where="")  # type: ignore[list-item]
    assert m.meta["host_steal_frac"] is None


def _with_host(src: Path, target: Path, steal: list[float | None], prov: dict[str, Any],
               speeds: list[tuple[float, float] | None] | None = None) -> Path:  # fmt: skip
    """A copy of a measured point with made-up host fields (named as such) in its provenance and repeats:
    steal and, where given, the Python timings (before, after) around each repeat."""
    meta = io.read_meta(src)
    meta["provenance"].update(prov)
    for rep, s in zip(meta["repeats"], steal, strict=True):
        rep["host_steal_frac"] = s
    for rep, sp in zip(meta["repeats"], speeds or [None] * len(meta["repeats"]), strict=True):
        if sp is not None:
            rep["host_speed_before_ms"], rep["host_speed_after_ms"] = sp
    target.parent.mkdir(parents=True, exist_ok=True)
    io.write_parquet(pl.read_parquet(src), target, meta)
    shutil.copy(src.with_name(src.name.replace("requests", "telemetry")),
                target.with_name(target.name.replace("requests", "telemetry")))  # fmt: skip
    return target


@pytest.mark.skipif(not POINT.with_suffix(".requests.parquet").exists(), reason="results/quick not in this checkout")
def test_summaries_and_the_calibration_table_carry_the_host(tmp_path: Path) -> None:
    src = POINT.with_suffix(".requests.parquet")
    made_up = {"cpu_id": "GenuineIntel 6/207/2", "host_speed_ms": 0.4521, "cpu_mhz": 2100.0}
    path = _with_host(src, tmp_path / "calibration/h100-80gb-hbm3-0000aaaa/opt1.3b.requests.parquet",
                      [0.01, 0.03, None], made_up)  # fmt: skip
    reps = analysis.summarize_repeats(path)
    assert [r["host_steal_frac"] for r in reps] == [0.01, 0.03, None]
    assert analysis.summarize_run(path)["host_steal_frac"] == pytest.approx(0.02)  # mean of the repeats with one
    r = calibration.table([path]).row(0, named=True)
    assert (r["cpu_id"], r["host_speed_ms"]) == ("GenuineIntel 6/207/2", 0.4521)
    assert r["host_steal_frac"] == pytest.approx(0.02)
    md = calibration.to_markdown(calibration.table([path]))
    assert "| Intel(R) Xeon(R) Processor (16; GenuineIntel 6/207/2; 0.452 ms) |" in md and "| 2.00% |" in md
    older = calibration.table([_place_old(src, tmp_path)]).row(0, named=True)  # a file written before the fields
    assert older["cpu_id"] is None and older["host_speed_ms"] is None and older["host_steal_frac"] is None
    assert calibration.table([path, _place_old(src, tmp_path)]).schema["host_speed_ms"] == pl.Float64


def _place_old(src: Path, tmp_path: Path) -> Path:
    target = tmp_path / "calibration/h100-80gb-hbm3-0000bbbb/opt1.3b.requests.parquet"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, target)
    shutil.copy(src.with_name(src.name.replace("requests", "telemetry")), target.with_name("opt1.3b.telemetry.parquet"))
    return target


def test_correlation_is_pearsons_r_with_the_fisher_z_interval() -> None:
    xs, ys = [0.50, 0.56, 0.78, 0.99, 1.23], [170.9, 168.7, 108.9, 92.7, 97.8]
    c = stats.correlation(xs, ys)
    res = st.pearsonr(xs, ys)
    z, half = math.atanh(res.statistic), st.norm.ppf(0.975) / math.sqrt(len(xs) - 3)
    assert c["n"] == 5 and c["r"] == pytest.approx(res.statistic)
    assert (c["ci_lo"], c["ci_hi"]) == (pytest.approx(math.tanh(z - half)), pytest.approx(math.tanh(z + half)))
    assert c["ci_hi"] < 0  # these five resolve a negative r
    # all 120 pairings of the five: twice the smaller tail (scipy's two-sided permutation p), 3 of 120 at or below r
    rs = [st.pearsonr(xs, p).statistic for p in itertools.permutations(ys)]
    tail = min(sum(r <= res.statistic + 1e-12 for r in rs), sum(r >= res.statistic - 1e-12 for r in rs))
    assert tail == 3 and c["p_perm"] == pytest.approx(2 * tail / 120)
    none = {"n": 3, "r": None, "ci_lo": None, "ci_hi": None, "p_perm": None}
    assert stats.correlation(xs[:3], ys[:3]) == none
    assert stats.correlation([0.5] * 5, ys) == {**none, "n": 5}  # hosts that do not differ: no r, not NaN
    with pytest.raises(ValueError, match="5 values against 4"):
        stats.correlation(xs, ys[:4])


def _made_up_table(frame: pl.DataFrame) -> pl.DataFrame:
    """Made-up calibration rows (named as such): ``frame``'s machines, models, GPU models and req/s with the
    other columns of a calibration table set to one value."""
    return frame.with_columns(driver=pl.lit(None, pl.String), cpu_model=pl.lit("x"), cpu_cores=pl.lit(16),
                              engine_version=pl.lit("0.26.0"), batch_size=pl.lit(256), n=pl.lit(3),
                              ci_lo=pl.lit(1.0), ci_hi=pl.lit(2.0), cv=pl.lit(0.1),
                              throughput_rps_sd=pl.lit(1.0))  # fmt: skip


def test_the_host_link_needs_four_machines_with_a_host_speed_of_one_gpu_model() -> None:
    """Made-up calibration rows (named as such): 5 H200s with a host speed and 1 without for a host-bound
    model, 3 for a GPU-bound one, and an H100 that is no part of the H200s' line."""
    rows = [("m1", "opt125m", "H200", 0.50, 170.0), ("m2", "opt125m", "H200", 0.56, 168.0),
            ("m3", "opt125m", "H200", 0.78, 109.0), ("m4", "opt125m", "H200", 0.99, 93.0),
            ("m5", "opt125m", "H200", 1.23, 98.0), ("m0", "opt125m", "H200", None, 60.0),
            ("m9", "opt125m", "H100", 3.0, 10.0),
            ("m1", "opt1.3b", "H200", 0.50, 63.6), ("m2", "opt1.3b", "H200", 0.56, 65.4),
            ("m3", "opt1.3b", "H200", 0.78, 65.3)]  # fmt: skip
    frame = pl.DataFrame(rows, schema=["machine", "model", "gpu_model", "host_speed_ms", "throughput_rps"],
                         orient="row")  # fmt: skip
    link = calibration.host_link(frame)
    assert link.select("model", "gpu_model", "machines").rows() == [("opt125m", "H200", 5)]
    r = link.row(0, named=True)
    want = stats.correlation([0.50, 0.56, 0.78, 0.99, 1.23], [170.0, 168.0, 109.0, 93.0, 98.0])
    assert (r["r"], r["r_ci_lo"], r["r_ci_hi"]) == pytest.approx((want["r"], want["ci_lo"], want["ci_hi"]))
    assert (r["lowest"], r["highest"]) == (0.50, 1.23)
    full = _made_up_table(frame)
    md = calibration.to_markdown(full)
    assert "- opt125m on H200: host speed 0.500 to 1.230 ms over 5 machines; Pearson r with req/s" in md
    assert "(95% CI, Fisher z; approximate with few machines), resolved; permutation p 0.0" in md
    assert "opt1.3b on H200: host speed" not in md
    assert calibration.host_link(frame.head(0)).columns == link.columns


def test_a_summary_of_files_older_than_a_metric_types_its_column() -> None:
    """A summary whose files all predate a metric holds only nulls there: typed as the metric, so that it
    concatenates with a newer summary."""
    old = analysis.complete(pl.DataFrame({"model": ["m"], "host_steal_frac": [None]}))
    assert old.schema["host_steal_frac"] == pl.Float64 and old.schema["client_cpu_frac"] == pl.Float64
    new = analysis.complete(pl.DataFrame({"model": ["n"], "host_steal_frac": [0.01]}))
    both = pl.concat([old, new.select(old.columns)])
    assert both["host_steal_frac"].to_list() == [None, 0.01]


def test_a_repeat_times_the_host_before_its_loads_and_after_them_with_no_thread_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Timed outside the sampler's and pollers' lifetime (their threads would slow the timing), around the
    loads, with the small probe; the made-up timings (named as such) land in the repeat's metadata."""
    events: list[tuple[str, Any]] = []
    timings = iter([0.61, 0.97])

    def timed(*args: object, **kwargs: object) -> float:
        events.append(("time", (args, kwargs, threading.active_count())))
        return next(timings)

    def loads(*a: object) -> list:
        events.append(("loads", threading.active_count()))
        return _no_requests()

    monkeypatch.setattr(provenance, "time_host_ms", timed)
    monkeypatch.setattr(measure, "_run_loads", loads)
    idle = threading.active_count()
    m = measure.measure([StandInServer()], [None], [], interval_s=0.05, sample=True, where="")  # type: ignore[list-item]
    assert [e[0] for e in events] == ["time", "loads", "time"]
    probe = ((), {}, idle)  # the result header's timing (its scale), with no sampler or poller thread alive
    assert events[0][1] == probe and events[2][1] == probe
    assert events[1][1] > idle  # ... while the loads ran beside them
    assert (m.meta["host_speed_before_ms"], m.meta["host_speed_after_ms"]) == (0.61, 0.97)
    assert analysis.host_speed_of(m.meta) == pytest.approx(0.79)
    assert analysis.host_speed_of({"host_speed_before_ms": 0.61}) is None  # an older or partial repeat


@pytest.mark.skipif(not POINT.with_suffix(".requests.parquet").exists(), reason="results/quick not in this checkout")
def test_summaries_and_the_calibration_table_carry_the_host_speed_of_each_repeat(tmp_path: Path) -> None:
    src = POINT.with_suffix(".requests.parquet")
    made_up = {"cpu_id": "GenuineIntel 6/207/2", "host_speed_ms": 0.5, "cpu_mhz": 2100.0}
    path = _with_host(src, tmp_path / "calibration/h200-0000aaaa/opt1.3b.requests.parquet", [None] * 3, made_up,
                      [(0.5, 0.7), None, (1.0, 1.2)])  # fmt: skip
    assert [r["host_speed_repeat_ms"] for r in analysis.summarize_repeats(path)] == pytest.approx([0.6, None, 1.1])
    assert analysis.summarize_run(path)["host_speed_repeat_ms"] == pytest.approx(0.85)  # the repeats timed
    assert calibration.table([path]).row(0, named=True)["host_speed_repeat_ms"] == pytest.approx(0.85)
    md = calibration.to_markdown(calibration.table([path]))
    assert "(16; GenuineIntel 6/207/2; 0.500 ms, repeats 0.850 ms) |" in md
    reps = calibration.repeats([path, _place_old(src, tmp_path)])
    assert reps.columns == ["machine", "model", "gpu_model", "repeat", "throughput_rps", "host_speed_repeat_ms"]
    mine = reps.filter(pl.col("machine") == "h200-0000aaaa")
    assert mine["host_speed_repeat_ms"].to_list() == pytest.approx([0.6, None, 1.1])
    assert mine["throughput_rps"].to_list() == [r["throughput_rps"] for r in analysis.summarize_repeats(src)]
    assert reps.filter(pl.col("machine") == "h100-80gb-hbm3-0000bbbb")["host_speed_repeat_ms"].null_count() == 3


def test_within_correlation_leaves_out_what_sets_groups_apart() -> None:
    """Made-up repeats (named as such) of three machines: across machines the faster host measures less, within
    each the faster repeat measures more; the within r is that of the deviations from each machine's mean."""
    xs = [0.5, 0.6, 0.7, 1.0, 1.1, 1.2, 1.5, 1.6, 1.8, 9.0]
    ys = [103.0, 101.0, 99.5, 204.0, 201.0, 199.0, 305.0, 303.0, 298.0, 1.0]
    groups = ["a", "a", "a", "b", "b", "b", "c", "c", "c", "lone"]  # a machine of one repeat tells nothing within
    c = stats.within_correlation(xs, ys, groups)
    assert stats.correlation(xs[:9], ys[:9])["r"] > 0.9  # across machines: the opposite sign
    dev = [(x - sum(xs[i:i + 3]) / 3, y - sum(ys[i:i + 3]) / 3)
           for i in (0, 3, 6) for x, y in zip(xs[i:i + 3], ys[i:i + 3], strict=True)]  # fmt: skip
    r = st.pearsonr(*zip(*dev, strict=True)).statistic
    assert (c["n"], c["groups"]) == (9, 3) and c["r"] == pytest.approx(r) and r < -0.9
    half = st.norm.ppf(0.975) / math.sqrt(9 - 3 - 2)
    assert (c["ci_lo"], c["ci_hi"]) == (pytest.approx(math.tanh(math.atanh(r) - half)),
                                        pytest.approx(math.tanh(math.atanh(r) + half)))  # fmt: skip
    # every pairing within the machines (6**3): the share at least as far from 0 as the observed r
    exact = []
    for pa, pb, pc in itertools.product(itertools.permutations(range(3)), repeat=3):
        ys_p = [y for i, p in zip((0, 3, 6), (pa, pb, pc), strict=True) for y in (ys[i + j] for j in p)]
        exact.append(stats.within_correlation(xs[:9], ys_p, groups[:9], n_resamples=1)["r"])
    want = sum(abs(e) >= abs(r) - 1e-12 for e in exact) / len(exact)
    assert c["p_perm"] == pytest.approx(want, abs=0.02) and want < 0.1
    # a weaker link, whose exact p (104 of the 216 pairings) a shuffle across machines, or one shuffle for
    # every resample, would miss
    weak = [101.0, 99.0, 100.5, 201.0, 199.0, 200.5, 300.0, 302.0, 299.0]
    assert stats.within_correlation(xs[:9], weak, groups[:9])["p_perm"] == pytest.approx(104 / 216, abs=0.01)
    assert stats.within_correlation(xs[:9], ys[:9], groups[:9], n_resamples=99)["p_perm"] >= 0.01  # counts r itself
    assert stats.within_correlation(xs[:5], ys[:5], groups[:5])["r"] is None  # 5 pairs in 2 groups: too few
    assert stats.within_correlation(xs[:6], ys[:6], groups[:6])["r"] is not None  # 6: N - k - 2 = 2
    assert stats.within_correlation([1.0] * 9, ys[:9], groups[:9])["r"] is None  # no deviation within
    assert stats.within_correlation([0.1] * 9, ys[:9], groups[:9])["r"] is None  # nor rounding's 1e-17
    assert stats.within_correlation([0.1] * 3 + xs[3:9], ys[:9], groups[:9])["r"] is not None  # one machine moves
    with pytest.raises(ValueError, match="9 x, 9 y and 8 group values"):
        stats.within_correlation(xs[:9], ys[:9], groups[:8])


def test_the_repeat_link_is_per_model_and_gpu_model_and_reaches_the_table() -> None:
    """Made-up repeats (named as such): four H200s with host speeds timed around their repeats, one H200 of
    an older file without them, and an H100 of its own."""
    rows = [(m, "opt125m", "H200", i, y, x)
            for m, base in (("m1", 170.0), ("m2", 110.0), ("m3", 95.0), ("m4", 140.0))
            for i, (x, y) in enumerate([(0.5, base + 8), (0.7, base), (0.9, base - 9)])]  # fmt: skip
    rows += [("m0", "opt125m", "H200", i, 100.0 + i, None) for i in range(3)]
    rows += [("m9", "opt125m", "H100", i, 90.0 + i, 0.5 + i) for i in range(3)]
    reps = pl.DataFrame(rows, schema=["machine", "model", "gpu_model", "repeat", "throughput_rps",
                                      "host_speed_repeat_ms"], orient="row")  # fmt: skip
    link = calibration.repeat_link(reps)
    assert link.select("model", "gpu_model", "machines", "repeats").rows() == [("opt125m", "H200", 4, 12)]
    r = link.row(0, named=True)
    h200 = reps.filter(pl.col("gpu_model") == "H200", pl.col("host_speed_repeat_ms").is_not_null())
    want = stats.within_correlation(h200["host_speed_repeat_ms"].to_list(), h200["throughput_rps"].to_list(),
                                    h200["machine"].to_list())  # fmt: skip
    assert (r["r"], r["r_ci_lo"], r["r_ci_hi"], r["p_perm"]) == pytest.approx(
        (want["r"], want["ci_lo"], want["ci_hi"], want["p_perm"])
    )
    assert r["r_ci_hi"] < 0
    table = pl.DataFrame({"machine": ["m1", "m2"], "model": ["opt125m"] * 2, "gpu_model": ["H200"] * 2,
                          "driver": [None, None], "cpu_model": ["x", "x"], "cpu_cores": [16, 16],
                          "engine_version": ["0.26.0"] * 2, "batch_size": [256, 256], "n": [3, 3],
                          "throughput_rps": [170.0, 110.0], "ci_lo": [160.0, 100.0], "ci_hi": [180.0, 120.0],
                          "cv": [0.02, 0.05], "throughput_rps_sd": [3.4, 5.5]})  # fmt: skip
    md = calibration.to_markdown(table, reps)
    assert (
        "- opt125m on H200, within machines: Pearson r of each repeat's req/s with the host speed timed "
        f"around it, {r['r']:.2f} ["
    ) in md and "; 12 repeats of 4 machines" in md
    assert "within machines" not in calibration.to_markdown(table)
    assert calibration.repeat_link(reps.head(0)).columns == link.columns


def test_the_repeat_link_says_how_its_r_stands_with_each_machine_left_out() -> None:
    """Made-up repeats (named as such): five H200s, one of which (m5) alone moves with its host, so that the
    verdict rests on it, and one (solo) with a single repeat, which is no part of a within-machine fit."""
    flat = {"m1": [150.0, 149.0, 151.0], "m2": [120.0, 121.0, 119.0], "m3": [100.0, 100.7, 99.5],
            "m4": [130.0, 129.5, 130.8]}  # fmt: skip
    rows = [(m, "opt125m", "H200", i, y, x) for m, ys in flat.items()
            for i, (x, y) in enumerate(zip([0.6, 0.7, 0.8], ys, strict=True))]  # fmt: skip
    rows += [("m5", "opt125m", "H200", i, y, x) for i, (x, y) in enumerate([(0.5, 170.0), (0.9, 120.0), (1.3, 90.0)])]
    rows += [("solo", "opt125m", "H200", 0, 300.0, 0.4)]
    reps = pl.DataFrame(rows, schema=["machine", "model", "gpu_model", "repeat", "throughput_rps",
                                      "host_speed_repeat_ms"], orient="row")  # fmt: skip
    r = calibration.repeat_link(reps).row(0, named=True)
    assert (r["machines"], r["repeats"]) == (5, 15) and r["r_ci_hi"] < 0
    without = {m: stats.within_correlation(*(s[c].to_list() for c in ("host_speed_repeat_ms", "throughput_rps",
                                                                      "machine")))
               for m in [*flat, "m5"] for s in [reps.filter(pl.col("machine") != m)]}  # fmt: skip
    assert without["m5"]["ci_lo"] < 0 < without["m5"]["ci_hi"]  # not resolved without m5
    assert all(without[m]["ci_hi"] < 0 for m in flat)  # resolved, as with all, without any other
    assert r["loo_fits"] == 5 and r["loo_resolved"] == 4  # solo's leaving out is the whole fit again: not one
    assert r["loo_weakest"] == "m5"
    w = without["m5"]
    assert (r["loo_weakest_r"], r["loo_weakest_ci_lo"], r["loo_weakest_ci_hi"]) == pytest.approx(
        (w["r"], w["ci_lo"], w["ci_hi"]))  # fmt: skip
    assert (r["r_loo_lo"], r["r_loo_hi"]) == pytest.approx(
        (min(c["r"] for c in without.values()), w["r"]))  # fmt: skip
    table = _made_up_table(pl.DataFrame({"machine": ["m1", "m5"], "model": ["opt125m"] * 2, "gpu_model": ["H200"] * 2,
                                         "throughput_rps": [150.0, 126.7]}))  # fmt: skip
    md = calibration.to_markdown(table, reps)
    assert w["r"] > 0  # the four flat machines alone lean the other way: the range crosses 0
    assert (f"15 repeats of 5 machines; one machine left out at a time: r {r['r_loo_lo']:.2f} to {w['r']:.2f}, "
            f"crossing 0, resolved with the same sign in 4 of 5; weakest without m5: r {w['r']:.2f} "
            f"[{w['ci_lo']:.2f}, {w['ci_hi']:.2f}]") in md  # fmt: skip


def test_the_host_link_counts_a_machine_that_turns_its_sign_as_against_it() -> None:
    """Made-up machine means (named as such): six H200s on a falling line and one outlier (m6) that turns the
    whole line rising: without m6 the link is resolved, with the other sign."""
    xs = [0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 2.0]
    ys = [200 - 60 * x + e for x, e in zip(xs, [0.0, 3.0, -2.0, 1.0, -3.0, 2.0], strict=False)] + [300.0]
    means = pl.DataFrame({"machine": [f"m{i}" for i in range(7)], "model": ["opt125m"] * 7,
                          "gpu_model": ["H200"] * 7, "host_speed_ms": xs, "throughput_rps": ys})  # fmt: skip
    link = calibration.host_link(means).row(0, named=True)
    without = {m: stats.correlation(s["host_speed_ms"].to_list(), s["throughput_rps"].to_list())
               for m in means["machine"] for s in [means.filter(pl.col("machine") != m)]}  # fmt: skip
    assert link["r_ci_lo"] > 0 and without["m6"]["ci_hi"] < 0
    assert all(without[f"m{i}"]["ci_lo"] > 0 for i in range(6))
    assert (link["loo_fits"], link["loo_resolved"], link["loo_weakest"]) == (7, 6, "m6")
    assert abs(without["m6"]["r"]) > min(abs(c["r"]) for c in without.values())  # weakest: not "nearest 0"
    assert link["r_loo_lo"] == pytest.approx(without["m6"]["r"]) == pytest.approx(link["loo_weakest_r"])
    mirrored = calibration.host_link(means.with_columns(-pl.col("host_speed_ms"))).row(0, named=True)
    assert mirrored["r"] == pytest.approx(-link["r"])
    assert (mirrored["loo_resolved"], mirrored["loo_weakest"]) == (6, "m6")
    table = _made_up_table(means)
    md = calibration.to_markdown(table)
    assert (f"permutation p {link['p_perm']:.3f}; one machine left out at a time: r {link['r_loo_lo']:.2f} to "
            f"{link['r_loo_hi']:.2f}, crossing 0, resolved with the same sign in 6 of 7; weakest without m6: r "
            f"{without['m6']['r']:.2f} [") in md  # fmt: skip
    four = calibration.to_markdown(table.head(4))
    assert "over 4 machines" in four and "; no r with one machine left out" in four


def test_a_correlation_without_its_permutation_test_has_the_same_r_and_ci() -> None:
    xs, ys = [0.5, 0.6, 0.9, 1.0, 1.2], [170.0, 160.0, 110.0, 120.0, 95.0]
    full, quick = stats.correlation(xs, ys), stats.correlation(xs, ys, permute=False)
    assert quick["p_perm"] is None and full["p_perm"] is not None
    assert {k: quick[k] for k in ("n", "r", "ci_lo", "ci_hi")} == {k: full[k] for k in ("n", "r", "ci_lo", "ci_hi")}
    xs, ys, groups = [*xs, 0.7], [*ys, 150.0], ["a"] * 3 + ["b"] * 3
    full, quick = stats.within_correlation(xs, ys, groups), stats.within_correlation(xs, ys, groups, n_resamples=0)
    assert quick["p_perm"] is None and full["p_perm"] is not None
    assert {k: quick[k] for k in ("n", "groups", "r", "ci_lo", "ci_hi")} == {
        k: full[k] for k in ("n", "groups", "r", "ci_lo", "ci_hi")}  # fmt: skip
