"""The GPU benchmarks' judging steps, on real result files: telemetry overhead (a CPU-engine smoke run of
``bench/telemetry_overhead.py run``, in fixtures) and batch control (the H100 results in bench/results)."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

import polars as pl
import pytest

from bench import batch_control, replicas, telemetry_overhead
from slmserve import io, runner, stats

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests/fixtures/telemetry-overhead"
H100 = ROOT / "bench/results/h100-batch-control/bench-out"


def test_settings_alternate_which_goes_first() -> None:
    assert [batch_control.order(telemetry_overhead.SETTINGS, r)[0] for r in range(4)] == ["sampler", "nosampler"] * 2


def test_overhead_compare_pairs_the_settings(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE, tmp_path / "out")
    frame = telemetry_overhead.compare(argparse.Namespace(out=tmp_path / "out"))
    assert frame["batch_size"].to_list() == [2, 4] and set(frame["sampler_n"]) == set(frame["nosampler_n"]) == {2}
    for row in frame.iter_rows(named=True):
        assert row["ratio"] == pytest.approx(row["sampler_mean"] / row["nosampler_mean"])
        assert row["loss_bound"] == pytest.approx(1 - row["ratio_ci_lo"])
        assert row["goal_met"] is (row["loss_bound"] <= telemetry_overhead.GOAL)
    assert pl.read_csv(tmp_path / "out/compare.csv").height == 2
    # the runs are what their folders say: the sampler on in one setting, off in the other
    for setting, on in (("sampler", True), ("nosampler", False)):
        meta = io.read_meta(FIXTURE / f"opt125m/{setting}/bs2.requests.parquet")
        assert {r["telemetry"]["enabled"] for r in meta["repeats"]} == {on}


def test_overhead_compare_names_an_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"no \*/<setting>/bs\*\.requests\.parquet"):
        telemetry_overhead.compare(argparse.Namespace(out=tmp_path))


def test_batch_control_verdicts_on_the_h100_results(tmp_path: Path) -> None:
    shutil.copytree(H100, tmp_path / "out", ignore=shutil.ignore_patterns("*.log", "*.txt"))
    frame = batch_control.compare(argparse.Namespace(out=tmp_path / "out"))
    got = {(r["model"], r["restart"], r["batch_size"]): r for r in frame.iter_rows(named=True)}
    default = got[("opt1.3b", "restart", 64)]  # vLLM's default CUDA-graph sizes: 1.06 [1.04, 1.09]
    pinned = got[("opt1.3b", "restart-graphs512", 64)]  # the same sizes on every server: 1.02 [0.99, 1.04]
    assert (default["verdict"], pinned["verdict"]) == ("differ", "agree")
    for r in got.values():
        assert r["verdict"] == stats.verdict(r["ratio_ci_lo"], r["ratio_ci_hi"], batch_control.AGREEMENT)
    assert len(got) == 20


def test_batch_control_rounds_set_the_small_batches_requests(tmp_path: Path) -> None:
    job = batch_control.sweep_job("opt1.3b", "restart", tmp_path / "p.parquet", tmp_path, [1, 8, 64], repeats=3,
                                  requests=1000, rounds=32)  # fmt: skip
    assert [runner.requests_for(job, b) for b in (1, 8, 64)] == [32, 256, 1000]


def test_replicas_compare_on_a_cpu_smoke_run(tmp_path: Path) -> None:
    # tests/fixtures/replicas-smoke: `bench/replicas.py run --model opt125m --replicas 1 2 --variants sequential
    # together together-mps --repeats 2 --requests 16 --output-len 8 --dtype bfloat16` on the CPU engine
    shutil.copytree(ROOT / "tests/fixtures/replicas-smoke", tmp_path / "out")
    frame = replicas.compare(argparse.Namespace(out=tmp_path / "out"))
    got = {(r["replicas"], r["variant"]): r for r in frame.iter_rows(named=True)}
    assert set(got) == {(1, "sequential"), (2, "sequential"), (2, "together"), (2, "together-mps")}
    assert set(frame["plan"]) == {"equal"} and got[(2, "together")]["batch_per_replica"] is not None
    assert got[(1, "sequential")]["gain"] == pytest.approx(1.0)
    together, sequential = got[(2, "together")], got[(2, "sequential")]
    assert together["gain"] == pytest.approx(together["throughput_rps"] / got[(1, "sequential")]["throughput_rps"])
    assert together["vs_sequential"] == pytest.approx(together["throughput_rps"] / sequential["throughput_rps"])
    assert together["kv_tokens"] == sequential["kv_tokens"] == "[29056, 29056]"  # explicit bytes on the CPU engine
    assert together["startup_span_s"] > 0 and together["n"] == 2
    mps = got[(2, "together-mps")]
    assert mps["status"] == "unsupported" and "MPS needs a GPU" in mps["reason"] and mps["throughput_rps"] is None


def test_replicas_compare_sets_a_plan_beside_the_equal_split(tmp_path: Path) -> None:
    """A plan's run (here the smoke run's two replicas filed as a 2x4 plan, in two variants) is its own row,
    with its gain over the equal split's one replica and its ratio to its own sequential start."""
    out = tmp_path / "out"
    shutil.copytree(ROOT / "tests/fixtures/replicas-smoke", out)
    for variant in ("sequential", "together"):
        for kind in ("requests", "telemetry"):
            shutil.copy(out / f"opt125m/{variant}/r2.{kind}.parquet", out / f"opt125m/{variant}/r2-b4.{kind}.parquet")
    frame = replicas.compare(argparse.Namespace(out=out))
    got = {(r["replicas"], r["plan"], r["variant"]): r for r in frame.iter_rows(named=True)}
    assert {k for k in got if k[1] == "2x4"} == {(2, "2x4", "sequential"), (2, "2x4", "together")}
    plan, equal = got[(2, "2x4", "together")], got[(2, "equal", "together")]
    assert plan["throughput_rps"] == pytest.approx(equal["throughput_rps"])
    assert plan["gain"] == pytest.approx(plan["throughput_rps"] / got[(1, "equal", "sequential")]["throughput_rps"])
    assert plan["vs_sequential"] == pytest.approx(
        plan["throughput_rps"] / got[(2, "2x4", "sequential")]["throughput_rps"]
    )
    assert got[(1, "equal", "sequential")]["gain"] == pytest.approx(1.0)


def test_replica_plans_from_the_command_line_and_the_advisor(tmp_path: Path) -> None:
    assert replicas.parse_plan("4x256") == (4, 256)
    for bad in ("4*256", "0x256", "4x"):
        with pytest.raises(ValueError, match="write it as REPLICASxBATCH"):
            replicas.parse_plan(bad)
    assert replicas.plan_name(Path("r2.requests.parquet")) == "equal"
    assert replicas.plan_name(Path("r4-b256.requests.parquet")) == "4x256"
    advice = ROOT / "paper_figures/quick/advisor.csv"  # OPT-125M: batch 256, 10 replicas fit; OPT-1.3B: 256, 1
    if not advice.exists():
        pytest.skip("paper_figures/quick not in this checkout")
    assert replicas.advisor_plan(advice, "opt125m", max_replicas=4) == (4, 256)
    assert replicas.advisor_plan(advice, "opt125m", max_replicas=12) == (9, 256)  # 9 fit (advisor.replicas_fit)
    assert replicas.advisor_plan(advice, "opt1.3b", max_replicas=4) == (1, 256)
    with pytest.raises(SystemExit, match="no row for opt13b"):
        replicas.advisor_plan(advice, "opt13b", max_replicas=4)


def test_startup_span_runs_from_first_launch_to_last_ready() -> None:
    servers = [{"launched_at": 10.0, "startup_s": 60.0}, {"launched_at": 11.0, "startup_s": 65.0}]
    assert replicas.startup_span_s(servers) == pytest.approx(66.0)
    assert replicas.startup_span_s([{"launched_at": 10.0, "startup_s": None}]) is None


def test_alternate_writes_each_repeat_as_it_ends(tmp_path: Path, monkeypatch) -> None:
    # A lent machine can go back mid-benchmark (2026-11-25: 13 telemetry runs on an H100 came back only as
    # log lines): what finished must be on disk after every repeat, not only at the end.
    job = batch_control.sweep_job("opt125m", "scheduler", tmp_path / "p.parquet", tmp_path, [2, 4], repeats=1)
    jobs = {name: dataclasses.replace(job, outputs=batch_control.setting_outputs(tmp_path, "opt125m", name, [2, 4]))
            for name in telemetry_overhead.SETTINGS}  # fmt: skip
    written: list[tuple[str, int]] = []
    measured = 0

    class Stub:  # stands in for the GPU slot and the vLLM server; no engine runs
        startup_s, kv_cache_tokens, ids, nvml_indices = 0.0, 0, [0], [0]

        def __init__(self, *args, **kwargs) -> None: ...

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None: ...

    def measure_point(p, srv, alloc, prompts, where=""):
        nonlocal measured
        measured += 1
        if measured > 4:  # the machine is lost during the second repeat
            raise RuntimeError("machine gone")
        return argparse.Namespace(meta={"loads": [{"n_ok": 1, "duration_s": 1.0}]})

    monkeypatch.setattr(batch_control, "GpuSlots", Stub)
    monkeypatch.setattr(batch_control, "VllmServer", Stub)
    monkeypatch.setattr(batch_control, "header", lambda *a: {})
    monkeypatch.setattr(runner, "load_prompts", lambda job: None)
    monkeypatch.setattr(runner, "server_spec", lambda *a: None)
    monkeypatch.setattr(runner, "measure_point", measure_point)
    monkeypatch.setattr(
        batch_control, "write_point", lambda paths, head, runs: written.append((paths[0].name, len(runs)))
    )
    with pytest.raises(RuntimeError, match="machine gone"):
        batch_control.alternate(jobs, [2, 4], 2, "test")
    assert sorted(written) == [("bs2.requests.parquet", 1)] * 2 + [("bs4.requests.parquet", 1)] * 2


def test_overhead_compare_reads_the_runs_from_a_log(tmp_path: Path) -> None:
    # The H100 run of 2026-11-25 whose result files were lost with the machine: only its log came back.
    log = ROOT / "bench/results/h100-telemetry-overhead/2026-11-25-opt1.3b/bench.log"
    telemetry_overhead.main(["compare", str(tmp_path), "--log", str(log)])
    row = pl.read_csv(tmp_path / "compare.csv").row(0, named=True)
    assert (row["model"], row["batch_size"], row["sampler_n"], row["nosampler_n"]) == ("opt1.3b", 256, 7, 6)
    assert row["sampler_mean"] == pytest.approx(1000 / 17.5843, rel=1e-4)  # the mean of 1000 / the 7 durations
    assert row["ratio"] == pytest.approx(row["sampler_mean"] / row["nosampler_mean"])


def test_overhead_log_without_a_gpu_label_is_named(tmp_path: Path) -> None:
    (tmp_path / "bench.log").write_text("INFO bench: repeat 0 batch 64 sampler: 10 requests in 1.00 s\n")
    with pytest.raises(SystemExit, match=r"bench\.log: no .* holds GPU"):
        batch_control.log_samples(tmp_path / "bench.log", telemetry_overhead.SETTINGS)
