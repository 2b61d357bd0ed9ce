"""The merge (analysis) and the figures on small hand-built runs: values, series and axis fields."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from slmserve import analysis, figures, io, telemetry
from slmserve.layout import FIGURES
from slmserve.loadgen import FRAME_SCHEMA


def write_run(tmp: Path, batch: int, status: str = "ok") -> Path:
    """A run as the runner writes it: 4 requests, all sent at t=0.5, ending 1, 2, 3, 4 s after t0."""
    req_path = tmp / f"bs{batch}.requests.parquet"
    rows = {
        "request_id": [0, 1, 2, 3], "replica": [0] * 4, "scheduled_s": [0.0] * 4, "sent_s": [0.5] * 4,
        "first_token_s": [0.6, 0.7, 0.8, 0.9], "end_s": [1.0, 2.0, 3.0, 4.0],
        "prompt_tokens": [8] * 4, "completion_tokens": [11] * 4, "n_chunks": [11] * 4, "itl_max_s": [0.1] * 4,
        "status": ["ok"] * 4, "error": [None] * 4,
    }  # fmt: skip
    req = pl.DataFrame(rows).with_columns(
        latency_s=pl.col("end_s") - pl.col("scheduled_s"),
        ttft_s=pl.col("first_token_s") - pl.col("scheduled_s"),
        tpot_s=(pl.col("end_s") - pl.col("first_token_s")) / (pl.col("completion_tokens") - 1),
    )
    req = req.select(list(FRAME_SCHEMA)).cast(FRAME_SCHEMA)  # type: ignore[arg-type]
    t0 = 100.0
    # telemetry: one GPU, 10 Hz from t0 to t0+5; SM activity 50 inside the window, 0 outside
    ts = [t0 + i / 10 for i in range(51)]
    tel = telemetry.empty_frame().vstack(
        pl.DataFrame(
            {
                "t_mono_s": ts,
                "t_wall_s": ts,
                "gpu": [0] * 51,
                "gpu_util_pct": [90.0] * 51,
                "mem_used_mb": [1000.0] * 51,
                "power_w": [200.0 if 100.5 <= t <= 104.0 else 60.0 for t in ts],
                "energy_mj": [1000.0 * i for i in range(51)],
                "sm_clock_mhz": [1980.0] * 51,
                "sm_active_pct": [50.0 if 100.5 <= t <= 104.0 else 0.0 for t in ts],
                "sm_occupancy_pct": [20.0] * 51,
                "dram_bw_pct": [30.0] * 51,
                "tensor_active_pct": [5.0] * 51,
                "cpu_util_pct": [10.0] * 51,
                "nvml_ok": [True] * 51,
                "gpm_ok": [True] * 51,
            }
        ).cast(telemetry.SCHEMA)  # type: ignore[arg-type]
    )
    meta = {
        "status": status, "reason": None if status == "ok" else "batch 9 needs 9 KV-cache tokens",
        "run": {"model": "opt125m", "tensor_parallel": 1, "batch_size": batch, "output_len": 11, "input_len": 8,
                "arrival_rate": float("inf"), "batch_control": "server", "profile": "test"},
        "provenance": {"gpu_models": ["NVIDIA H100 80GB HBM3"], "engine": "vllm", "engine_version": "0.26.0",
                       "git_sha": "abc", "cpu_model": "x"},
        "server": {"kv_cache_tokens": 1000}, "gpu_ids": ["0"],
        "load": {"t0_mono": t0, "peak_inflight": 4, "lag_p99_s": 0.001, "lag_ok": True, "inflight_ok": True,
                 "client_cpu_frac": 0.2},
    }  # fmt: skip
    io.write_parquet(req if status == "ok" else req.head(0), req_path, meta)
    io.write_parquet(tel, analysis.telemetry_path(req_path), meta)
    return req_path


def test_summarize_run_values(tmp_path: Path) -> None:
    row = analysis.summarize_run(write_run(tmp_path, 4), {"opt125m": {"family": "OPT", "params": "125M"}})
    assert row["family"] == "OPT" and row["status"] == "ok" and row["batch_size"] == 4
    assert row["duration_s"] == pytest.approx(3.5)  # first send 0.5 to last end 4.0
    assert row["throughput_rps"] == pytest.approx(4 / 3.5)
    assert row["output_tok_s"] == pytest.approx(44 / 3.5)
    assert row["latency_mean_s"] == pytest.approx(2.5)
    assert row["ttft_mean_s"] == pytest.approx(0.75)
    assert row["latency_p50_s"] == pytest.approx(2.5)
    # telemetry restricted to [100.5, 104.0]: SM activity 50 throughout, energy 35 ticks x 1 J
    assert row["sm_active_mean"] == pytest.approx(50.0) and row["sm_active_max"] == pytest.approx(50.0)
    assert row["power_w_mean"] == pytest.approx(200.0)
    assert row["energy_j"] == pytest.approx(35.0)
    assert row["energy_per_token_j"] == pytest.approx(35.0 / 44)
    assert row["gpu_model"] == "NVIDIA H100 80GB HBM3" and row["client_ok"] is True


def test_infeasible_run_is_kept_with_reason(tmp_path: Path) -> None:
    summary = analysis.summarize_runs([write_run(tmp_path, 1), write_run(tmp_path, 512, status="infeasible")])
    assert summary["status"].to_list() == ["ok", "infeasible"]
    assert summary.filter(pl.col("status") == "infeasible")["reason"][0].startswith("batch 9 needs")
    assert summary["throughput_rps"][1] is None


def test_throughput_latency_figure_plots_runs(tmp_path: Path) -> None:
    paths = [write_run(tmp_path, b) for b in (1, 2)] + [write_run(tmp_path, 512, status="infeasible")]
    summary = analysis.summarize_runs(paths)
    chart, caption = figures.throughput_latency(summary)
    spec = chart.to_dict()
    layer = spec["layer"][1]
    assert layer["encoding"]["x"]["field"] == "latency_mean_s"
    assert layer["encoding"]["y"]["field"] == "throughput_rps"
    assert layer["encoding"]["color"]["field"] == "model"
    data = pl.DataFrame(next(iter(spec["datasets"].values())))
    assert data["batch_size"].to_list() == [1, 2]  # the infeasible run is not plotted
    assert data["throughput_rps"].to_list() == pytest.approx([4 / 3.5] * 2)
    assert "NVIDIA H100 80GB HBM3" in caption and "vllm 0.26.0" in caption and "1 infeasible" in caption
    out = figures.save(chart, caption, tmp_path / "fig" / "tl")
    assert [p.suffix for p in out] == [".png", ".svg", ".html", ".md"]
    assert out[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in out[1].read_text() and "vega" in out[2].read_text()
    json.dumps(spec)  # the spec is valid JSON (no inf/NaN)


def test_planned_rows_read_their_keys_from_the_result_paths() -> None:
    models = {"opt1.3b": {"family": "OPT", "params": "1.3B"}}
    run = analysis.planned_row("results/quick/runs/opt1.3b/tp2-out256-rateinf/bs64.requests.parquet", models)
    assert (run["model"], run["tp"], run["output_len"], run["batch_size"]) == ("opt1.3b", 2, 256, 64)
    assert run["arrival_rate"] == float("inf") and run["status"] == analysis.NOT_MEASURED
    assert (run["family"], run["params"]) == ("OPT", "1.3B")
    point = analysis.planned_row("/abs/results/points/opt6.7b/tp1-out32-rate10.requests.parquet")
    assert (point["model"], point["output_len"], point["arrival_rate"]) == ("opt6.7b", 32, 10.0)
    assert point["batch_size"] is None and "replicas" not in point
    rep = analysis.planned_row("results/replication/opt2.7b_r3.parquet")
    assert (rep["model"], rep["replicas"], rep["plan"]) == ("opt2.7b", 3, "equal")
    plan = analysis.planned_row("results/replication/opt2.7b_advisor-mps.parquet")
    assert (plan["model"], plan["replicas"], plan["plan"], plan["mps"]) == ("opt2.7b", None, "advisor", True)
    with pytest.raises(ValueError, match="not a result path"):
        analysis.planned_row("results/summary/sweep.parquet")


def test_not_measured_runs_are_counted_in_captions_and_left_out_of_plots(tmp_path: Path) -> None:
    measured = [write_run(tmp_path, 8)]
    summary = analysis.with_not_measured(
        analysis.summarize_runs(measured),
        [
            "r/runs/opt125m/tp1-out256-rateinf/bs16.requests.parquet",
            "r/runs/opt1.3b/tp1-out256-rateinf/bs8.requests.parquet",
        ],
    )
    assert summary.height == 3
    assert summary.filter(pl.col("status") == analysis.NOT_MEASURED)["batch_size"].sort().to_list() == [8, 16]
    chart, caption = figures.throughput_latency(summary)
    assert "1 measured" in caption and "2 planned but not measured yet" in caption
    assert "OPT-1.3B: not measured yet" in caption
    data = pl.DataFrame(next(iter(chart.to_dict()["datasets"].values())))
    assert data["batch_size"].to_list() == [8]
    # a model with one infeasible run and the rest still missing is not "not served"
    infeasible = analysis.summarize_runs([write_run(tmp_path, 9, status="infeasible")])
    partial = analysis.with_not_measured(infeasible, ["r/runs/opt125m/tp1-out256-rateinf/bs1.requests.parquet"])
    _, text = figures.throughput_latency(partial)
    assert "OPT-125M: none measured yet (1 not measurable: batch 9 needs 9 KV-cache tokens; 1 not measured yet)" in text
    assert "not served" not in text
    # nothing measured at all: the planned rows alone
    only = analysis.with_not_measured(analysis.summarize_runs([]), ["r/replication/opt125m_r2.parquet"])
    assert only.select("model", "replicas", "status").row(0) == ("opt125m", 2, analysis.NOT_MEASURED)
    assert analysis.with_not_measured(summary, []) is summary


def test_every_figure_draws_a_summary_without_one_measured_run() -> None:
    """A campaign that has not measured anything of an experiment yet (re-plot) or whose models the engine
    does not serve: every figure is still drawn, empty, and its caption says why."""
    runs = [f"r/runs/opt125m/tp1-out256-rateinf/bs{b}.requests.parquet" for b in (1, 2)]
    points = ["r/points/opt6.7b/tp1-out32-rate10.requests.parquet"]
    reps = ["r/replication/opt125m_r1.parquet", "r/replication/opt125m_r2.parquet"]
    empty = analysis.summarize_runs([])
    sources = {
        "sweep": analysis.with_not_measured(empty, runs),
        "families": analysis.with_not_measured(empty, runs),
        "output_lengths": analysis.with_not_measured(empty, points),
        "replication": analysis.with_not_measured(empty, reps),
    }
    for name, fig in FIGURES.items():
        chart, caption = fig.draw(sources[fig.source])
        json.dumps(chart.to_dict(), allow_nan=False)
        assert "0 measured" in caption and "planned but not measured yet" in caption, name
        assert "not measured yet" in caption.split("Runs:")[1], name
