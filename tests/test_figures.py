"""The paper's figures (2-8), the extras and Table 1 on small hand-made summaries: the plotted data, the
encoded fields, the captions (infeasible and not-served models, missing telemetry) and the saved files."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from slmserve import figures, stats
from slmserve.figures import names
from slmserve.layout import FIGURES

GPU = "NVIDIA H100 80GB HBM3"
INF = math.inf
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
TELEMETRY = [
    "sm_active_mean", "sm_active_max", "sm_occupancy_mean", "sm_occupancy_max", "dram_bw_mean", "dram_bw_max",
    "tensor_active_mean", "gpu_util_mean", "gpu_util_max", "power_w_mean", "power_w_mean_per_gpu", "energy_j",
    "energy_per_token_j",
]  # fmt: skip
MODELS = {
    "opt125m": ("OPT", "125M"),
    "opt1.3b": ("OPT", "1.3B"),
    "opt6.7b": ("OPT", "6.7B"),
    "llama7b": ("LLaMA", "7B"),
    "mpt7b": ("MPT", "7B"),
    "gptj6b": ("GPT-J", "6B"),
    "opt2.7b": ("OPT", "2.7B"),
}


def run(model: str, batch: int, *, tp: int = 1, out: int = 256, rate: float = INF, status: str = "ok",
        reason: str | None = None, preemptions: int = 0, gpu: str = GPU) -> dict[str, Any]:  # fmt: skip
    """One summary row (the schema of analysis.summarize_runs); metrics are simple functions of the batch."""
    family, params = MODELS[model]
    row: dict[str, Any] = {
        "model": model, "family": family, "params": params, "tp": tp, "batch_size": batch, "output_len": out,
        "input_len": 512, "arrival_rate": rate, "status": status, "reason": reason,
        "gpu_model": gpu, "engine": "vllm", "engine_version": "0.26.0", "profile": "test",
    }  # fmt: skip
    if status != "ok":
        return row
    size = names._params_value(params) / 1e9
    row.update(
        n_ok=500, throughput_rps=batch / (1 + size) / tp ** 0.5, output_tok_s=batch * out / (1 + size),
        latency_mean_s=10 + batch / 10 + out / 100, latency_p50_s=10.0, latency_p99_s=20.0, ttft_mean_s=0.5,
        tpot_mean_s=0.02, preemptions=preemptions, preemptions_measured_only=True,
        sm_active_mean=10 + math.log2(batch), sm_active_max=min(100.0, 50 + 5 * math.log2(batch)),
        sm_occupancy_mean=5 + math.log2(batch), sm_occupancy_max=20 + math.log2(batch),
        dram_bw_mean=30 + 4 * math.log2(batch), dram_bw_max=60 + 4 * math.log2(batch), tensor_active_mean=3.0,
        gpu_util_mean=80 - math.log2(batch), gpu_util_max=100.0, power_w_mean=(150 + 10 * size) * tp,
        power_w_mean_per_gpu=150 + 10 * size, energy_j=1000.0, energy_per_token_j=1.0 / batch,
    )  # fmt: skip
    if gpu.startswith("CPU"):
        row.update(dict.fromkeys(TELEMETRY))
    return row


def frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(rows, infer_schema_length=None)


def dataset(chart: Any) -> pl.DataFrame:
    """The one dataset a chart plots."""
    spec = chart.to_dict()
    (values,) = spec["datasets"].values()
    return pl.DataFrame(values)


@pytest.fixture
def sweep() -> pl.DataFrame:
    rows = [run("opt125m", b) for b in BATCHES]
    rows += [run("opt1.3b", b, preemptions=12 if b == 256 else 0) for b in BATCHES[:-1]]
    rows += [run("opt1.3b", 512, status="infeasible", reason="batch 512 needs 393216 KV-cache tokens, 250000 fit")]
    rows += [run("opt1.3b", b, tp=2) for b in (1, 2, 4)]  # not on one GPU: left out of Figures 3, 4, 8
    rows += [run("opt125m", 8, out=64, rate=10.0)]  # another workload: left out of the batch figures
    return frame(rows)


@pytest.fixture
def families_summary() -> pl.DataFrame:
    rows = [run(m, b) for m in ("opt6.7b", "llama7b", "gptj6b") for b in (1, 2, 4, 8)]
    rows += [
        run("mpt7b", b, status="infeasible", reason="server did not start: unsupported architecture") for b in (1, 2)
    ]
    return frame(rows)


@pytest.fixture
def outlen_summary() -> pl.DataFrame:
    """The output-length experiment: every point at one batch (64, --max-num-seqs), the effective batch
    falling as outputs grow, preemptions at 256 output tokens when all requests arrive at once."""
    rows = []
    for rate in (INF, 100.0, 10.0):
        for out in (32, 64, 128, 256):
            row = run("opt6.7b", 64, out=out, rate=rate, preemptions=5 if out == 256 and rate == INF else 0)
            rows.append({**row, "effective_batch": 64 * 128 / max(out, 128) - (0 if rate == INF else 10)})
    return frame(rows)


@pytest.fixture
def replication() -> pl.DataFrame:
    rows = []
    for model, max_batch in (("opt125m", 512), ("opt1.3b", 256), ("opt2.7b", 128)):
        family, params = MODELS[model]
        for n in (1, 2, 3):
            row = {
                "model": model, "family": family, "params": params, "replicas": n, "batch_per_replica": max_batch // n,
                "status": "ok", "reason": None, "gpu_model": GPU, "engine": "vllm", "engine_version": "0.26.0",
                "input_len": 512, "output_len": 256, "n_ok": 500, "throughput_rps": 10.0 * n ** 0.5,
                "latency_mean_s": 30.0 / n, "gpu_util_mean": 60.0 + 10 * n, "power_w_mean": 200.0 + 30 * n,
                "sm_active_mean": 30.0 + n, "dram_bw_mean": 40.0 + n, "energy_per_token_j": 0.5 / n,
            }  # fmt: skip
            if model == "opt2.7b" and n == 3:
                row.update({k: None for k in row if k not in ("model", "family", "params", "replicas", "gpu_model",
                                                               "engine", "engine_version", "input_len", "output_len",
                                                               "batch_per_replica")})  # fmt: skip
                row.update(status="infeasible", reason="3 replicas: weights and KV cache exceed 12 GB each")
            rows.append(row)
    return frame(rows)


@pytest.fixture
def cpu_sweep() -> pl.DataFrame:
    return frame([run("opt125m", b, out=16, gpu="CPU: Intel Xeon") for b in (1, 2, 4, 8)])


def all_figures(sweep, families_summary, outlen_summary, replication) -> dict[str, tuple[Any, str]]:
    inputs = {"sweep": sweep, "families": families_summary, "output_lengths": outlen_summary,
              "replication": replication}  # fmt: skip
    return {name: fig.draw(inputs[fig.source]) for name, fig in FIGURES.items()}


def test_display_names() -> None:
    assert figures.display_name("opt1.3b") == "OPT-1.3B"
    assert figures.display_name("gptj6b") == "GPT-J-6B"
    assert figures.display_name("llama7b", "LLaMA", "7B") == "LLaMA-7B"
    assert figures.display_name("weird") == "weird"


def test_families_curves_and_not_served_model(families_summary: pl.DataFrame) -> None:
    chart, cap = figures.families(families_summary)
    spec = chart.to_dict()
    points = spec["layer"][1]["encoding"]
    assert points["x"]["field"] == "latency_mean_s" and points["y"]["field"] == "throughput_rps"
    assert points["color"]["field"] == "model"
    assert spec["layer"][2]["encoding"]["text"]["field"] == "batch_size"
    data = dataset(chart)
    assert sorted(set(data["model"])) == ["GPT-J-6B", "LLaMA-7B", "OPT-6.7B"]
    assert data.filter(pl.col("model") == "LLaMA-7B")["batch_size"].to_list() == [1, 2, 4, 8]
    assert points["color"]["sort"] == ["GPT-J-6B", "OPT-6.7B", "LLaMA-7B"]  # by size
    assert "MPT-7B: not served: server did not start: unsupported architecture" in cap
    assert "2 infeasible" in cap and GPU in cap and "vllm 0.26.0" in cap


def test_families_missing_family_is_named() -> None:
    chart, cap = figures.families(frame([run("opt6.7b", b) for b in (1, 2)]))
    assert "LLaMA: no run in this summary" in cap and "GPT-J: no run" in cap
    assert dataset(chart).height == 2


def _rep(model: str, batch: int, mean: float, sd: float | None, n: int = 3, gpu: str = GPU) -> dict[str, Any]:
    """A summary row of ``n`` repeats with the given throughput mean and sd."""
    return {**run(model, batch, gpu=gpu), "throughput_rps": mean, "throughput_rps_sd": sd, "throughput_rps_n": n}


def _ratio_line(rows: list[dict[str, Any]]) -> str:
    _, cap = figures.families(frame(rows))
    (line,) = [x for x in cap.splitlines() if x.startswith("- Throughput over") or x.startswith("- No ratios")]
    return line


def test_families_ratio_to_opt_per_batch_with_ci() -> None:
    """Figure 2's claim as numbers: LLaMA-7B over OPT-6.7B per batch on one GPU model, grouped by its CI."""
    opt = {1: (5.0, 0.1), 4: (10.0, 0.1), 8: (20.0, 0.02), 16: (30.0, 0.3), 128: (40.0, 0.04), 256: (50.0, 0.54)}
    rows = [_rep("opt6.7b", b, m, sd) for b, (m, sd) in opt.items()]
    rows += [_rep("opt6.7b", 32, 10.0, 0.1, gpu="NVIDIA H200")]
    rows += [
        _rep("llama7b", 1, 5.15, None, n=1),  # one repeat: a ratio, no CI
        _rep("llama7b", 4, 10.0, 0.1),  # [0.977, 1.023]: inside 1 ± 3%, holds 1
        _rep("llama7b", 8, 20.2, 0.02),  # 1% more, resolved, and inside 1 ± 3%
        _rep("llama7b", 16, 30.0, 3.0),  # holds 1, far too wide
        _rep("llama7b", 128, 44.0, 0.04),  # 10% more: excludes 1, outside 1 ± 3%
        _rep("llama7b", 256, 50.75, 0.54),  # [0.990, 1.040]: stats.verdict's "agree" at 3%, not inside 1 ± 3%
        _rep("llama7b", 32, 10.0, 0.1),  # other GPU model than OPT-6.7B's b=32: no pair
        _rep("llama7b", 64, 10.0, 0.1),  # no OPT point at b=64
        _rep("gptj6b", 2, 3.0, 0.1),  # no OPT point at b=2
    ]
    line = _ratio_line(rows)
    said = ("LLaMA-7B: b=1 1.030 (no CI), b=4 1.000 [0.977, 1.023], b=8 1.010 [1.008, 1.012], "
            "b=16 1.000 [0.755, 1.245], b=128 1.100 [1.098, 1.102], b=256 1.015 [0.990, 1.040] (")  # fmt: skip
    assert said in line and "b=32" not in line and "b=64" not in line
    assert "(CI inside 1 ± 3% at b=4, 8; CI excludes 1 at b=8, 128; CI beyond 1 ± 3% (a difference larger than " \
           "3%) at b=128; inconclusive (CI holds 1 and reaches past 1 ± 3%) at b=16, 256)" in line  # fmt: skip
    assert "GPT-J-6B: no batch measured for both on one GPU model" in line


def test_families_drain_product_per_batch_across_models() -> None:
    """throughput x mean latency / (n/2) per batch, its range across the models and the largest spread."""
    points = {("opt6.7b", 1): (1.0, 250.0), ("gptj6b", 1): (1.2, 210.0), ("opt6.7b", 8): (8.0, 32.0),
              ("gptj6b", 8): (9.0, 28.0), ("gptj6b", 64): (30.0, 10.0)}  # fmt: skip
    rows = [{**run(m, b), "throughput_rps": t, "latency_mean_s": lat} for (m, b), (t, lat) in points.items()]
    _, cap = figures.families(frame(rows))
    (line,) = [x for x in cap.splitlines() if "Little's law" in x]
    assert "per batch across the models: b=1 1.000-1.008, b=8 1.008-1.024; largest spread 1.6%." in line
    assert "b=64" not in line  # one model only
    _, cap = figures.families(frame([r for r in rows if r["model"] == "gptj6b"]))
    assert "Little's law" not in cap


def test_families_ratio_needs_one_opt_curve() -> None:
    rows = [_rep(m, 4, 10.0, 0.1) for m in ("opt6.7b", "opt2.7b", "llama7b")]
    assert _ratio_line(rows) == "- No ratios between families: 2 OPT curves (OPT-2.7B, OPT-6.7B), no one reference."


def test_output_lengths_series_per_rate(outlen_summary: pl.DataFrame) -> None:
    chart, cap = figures.output_lengths(outlen_summary)
    spec = chart.to_dict()
    json.dumps(spec, allow_nan=False)
    left, _ = spec["hconcat"]
    enc = left["layer"][1]["encoding"]
    assert enc["color"]["field"] == "rate" and enc["color"]["sort"] == ["inf", "100", "10"]
    assert left["layer"][2]["encoding"]["text"]["field"] == "output_len"
    assert left["layer"][0]["encoding"]["order"]["field"] == "output_len"
    data = dataset(chart)
    assert "arrival_rate" not in data.columns
    assert data.height == 12 and set(data["rate"]) == {"inf", "100", "10"}
    inf = data.filter(pl.col("rate") == "inf").sort("output_len")
    assert inf["output_len"].to_list() == [32, 64, 128, 256]
    assert inf["batch_size"].to_list() == [64] * 4
    assert inf["effective_batch"].to_list() == pytest.approx([64, 64, 64, 32])
    assert "Output length and arrival rate, OPT-6.7B" in spec["title"]
    assert "Poisson" in cap


def test_output_lengths_shows_the_effective_batch(outlen_summary: pl.DataFrame) -> None:
    """Figure 2 (right) shows its mechanism: the effective batch per output length beside the one batch
    every point ran at, and the caption says so (no per-length batch)."""
    chart, cap = figures.output_lengths(outlen_summary)
    right = chart.to_dict()["hconcat"][1]
    assert right["layer"][0]["encoding"]["y"]["field"] == "batch_size"  # the --max-num-seqs limit, dashed
    assert right["layer"][1]["encoding"]["y"]["field"] == "effective_batch"
    assert right["layer"][1]["encoding"]["x"]["field"] == "output_len"
    assert "One batch for every point: vLLM started with --max-num-seqs = 64" in cap
    assert "batch per output length" not in cap
    assert "32 tokens at inf req/s: 64.0; 64 tokens at inf req/s: 64.0; 128 tokens at inf req/s: 64.0; " \
           "256 tokens at inf req/s: 32.0; 32 tokens at 100 req/s: 54.0" in cap  # fmt: skip
    assert "polled at 1 Hz" in cap
    assert (
        "Preemptions (vLLM's counter, mean over repeats) at 1 of 12 plotted points: 256 tokens at inf req/s: 5." in cap
    )
    no_eff = figures.output_lengths(outlen_summary.drop("effective_batch"))[1]
    assert "Effective batch: not recorded in this summary (right panel empty)." in no_eff
    # how many gauge samples (1 Hz) a point's average rests on: a short run has few
    counted = outlen_summary.with_columns(gauge_samples=pl.when(pl.col("output_len") == 32).then(1).otherwise(12))
    cap = figures.output_lengths(counted)[1]
    assert "32 tokens at inf req/s: 64.0 (1 sample); 64 tokens at inf req/s: 64.0 (12 samples);" in cap
    assert "in brackets the fewest gauge samples a repeat averaged" in cap


def test_sm_metrics_panels(sweep: pl.DataFrame) -> None:
    chart, cap = figures.sm_metrics(sweep)
    spec = chart.to_dict()
    assert [p["title"] for p in spec["hconcat"]] == ["SM activity", "SM occupancy"]
    lines = spec["hconcat"][0]["layer"][0]
    assert lines["encoding"]["x"]["field"] == "batch_size"
    assert lines["encoding"]["x"]["scale"] == {"type": "log", "base": 2}
    assert lines["encoding"]["x"]["axis"]["values"] == BATCHES
    assert lines["encoding"]["y"]["field"] == "value" and lines["encoding"]["color"]["field"] == "model"
    assert lines["encoding"]["strokeDash"]["field"] == "stat"
    assert spec["hconcat"][1]["layer"][0]["transform"] == [{"filter": {"field": "panel", "equal": "SM occupancy"}}]
    data = dataset(chart)
    assert set(data["panel"]) == {"SM activity", "SM occupancy"} and set(data["stat"]) == {"mean", "max"}
    # one GPU, the all-at-once 256-token workload, measured runs only: 10 + 9 batches per metric
    assert data.filter((pl.col("panel") == "SM activity") & (pl.col("stat") == "max")).height == 19
    opt125 = data.filter(
        (pl.col("model") == "OPT-125M") & (pl.col("panel") == "SM activity") & (pl.col("stat") == "mean")
    )
    assert opt125.sort("batch_size")["value"].to_list() == pytest.approx([10 + i for i in range(10)])
    assert "NVML" in cap and "1 runs of other workloads are left out" in cap and "1 infeasible" in cap


def test_power_at_largest_batch_without_preemption(sweep: pl.DataFrame) -> None:
    chart, cap = figures.power(sweep)
    spec = chart.to_dict()
    bars = spec["layer"][0]["encoding"]
    assert bars["x"]["field"] == "model" and bars["y"]["field"] == "power_w_mean"
    assert spec["layer"][1]["encoding"]["text"]["field"] == "label"
    data = dataset(chart).sort("model")
    assert data["model"].to_list() == ["OPT-1.3B", "OPT-125M"]
    assert data["batch_size"].to_list() == [128, 512]  # bs 256 of OPT-1.3B preempted, 512 infeasible
    assert data["label"].to_list() == ["bs 128", "bs 512"]
    assert data["power_w_mean"].to_list() == pytest.approx([163.0, 151.25])
    assert "OPT-1.3B: batch 128" in cap


def test_util_throughput_panels(sweep: pl.DataFrame) -> None:
    chart, _ = figures.util_throughput(sweep)
    spec = chart.to_dict()
    assert [p["layer"][0]["encoding"]["y"]["title"] for p in spec["hconcat"]] == [
        "Average GPU utilisation (%)", "Throughput (requests/s)"
    ]  # fmt: skip
    assert "strokeDash" not in spec["hconcat"][0]["layer"][0]["encoding"]  # one statistic: no line styles
    data = dataset(chart)
    thr = data.filter((pl.col("panel") == "Throughput") & (pl.col("model") == "OPT-125M")).sort("batch_size")
    assert thr["value"].to_list() == pytest.approx([b / 1.125 for b in BATCHES])


def test_dram_and_energy_vs_batch(sweep: pl.DataFrame) -> None:
    chart, cap = figures.dram_bandwidth(sweep)
    spec = chart.to_dict()
    assert spec["layer"][0]["encoding"]["x"]["scale"]["base"] == 2
    data = dataset(chart)
    assert set(data["stat"]) == {"mean", "max"} and set(data["panel"]) == {"DRAM bandwidth"}
    assert data.filter((pl.col("stat") == "max") & (pl.col("batch_size") == 512))["value"].to_list() == [96.0]
    assert "Mind the Memory Gap" in cap and "memory-bound" in cap
    chart, cap = figures.energy_per_token(sweep)
    assert chart.to_dict()["layer"][0]["encoding"]["y"]["scale"] == {"type": "log"}
    data = dataset(chart).filter(pl.col("model") == "OPT-125M").sort("batch_size")
    assert data["value"].to_list() == pytest.approx([1 / b for b in BATCHES])


def test_replication_tradeoff(replication: pl.DataFrame) -> None:
    chart, cap = figures.replication_tradeoff(replication)
    spec = chart.to_dict()
    assert spec["layer"][2]["encoding"]["text"]["field"] == "replicas"
    assert spec["layer"][1]["encoding"]["color"]["sort"] == ["OPT-125M", "OPT-1.3B", "OPT-2.7B"]
    data = dataset(chart)
    assert data.height == 8
    assert data.filter(pl.col("model") == "OPT-2.7B")["replicas"].to_list() == [1, 2]
    assert "OPT-2.7B × 3 replicas: infeasible: 3 replicas" in cap
    assert "Workload: prompt/output tokens: [512]/[256]; replicas: 1, 2, 3" in cap
    assert "Requests per point: 500" in cap and "8 measured, 1 infeasible" in cap
    assert "each with an equal share of the configured memory share" in cap and "memory_budget_gb" not in cap


def test_replication_caption_names_an_emulated_gpu_budget(replication: pl.DataFrame) -> None:
    """config/a100-36gb.yaml: every replica server splits 36 GB (the paper's A100 setting) on a larger GPU."""
    _, cap = figures.replication_tradeoff(replication.with_columns(memory_budget_gb=pl.lit(36.0)))
    assert "each with an equal share of 36 GB (engine.memory_budget_gb: a smaller GPU emulated" in cap
    assert "NVIDIA H100" in cap  # the GPU whose compute, bandwidth and power the runs had


@pytest.mark.parametrize(
    ("name", "field"),
    [("replication_gpu_util", "gpu_util_mean"), ("replication_power", "power_w_mean"),
     ("energy_per_token_replicas", "energy_per_token_j")],
)  # fmt: skip
def test_replication_bars(replication: pl.DataFrame, name: str, field: str) -> None:
    chart, cap = FIGURES[name].draw(replication)
    enc = chart.to_dict()["layer"][0]["encoding"]
    assert enc["x"]["field"] == "model" and enc["y"]["field"] == field
    assert enc["xOffset"]["field"] == "setup" and enc["color"]["field"] == "setup"
    assert enc["color"]["sort"] == ["×1", "×2", "×3"] and enc["color"]["title"] == "Replicas"
    data = dataset(chart)
    ci = [f"{field}_ci_lo", f"{field}_ci_hi"]  # every bar metric has a CI (analysis.CI_METRICS)
    assert data.columns == ["model", "replicas", "setup", field, *ci,
                            *(["energy_window_ok"] if "energy" in field else [])]  # fmt: skip
    expected = replication.filter(pl.col("model") == "opt125m").sort("replicas")[field].to_list()
    assert data.filter(pl.col("model") == "OPT-125M").sort("replicas")[field].to_list() == pytest.approx(expected)
    assert "NVIDIA H100" in cap and "no GPU telemetry" not in cap


@pytest.fixture
def plans(replication: pl.DataFrame) -> pl.DataFrame:
    """The replication summary with 3 repeats per run and the batching advisor's plan for OPT-125M, plain and
    under MPS, and for OPT-1.3B under MPS not measured yet."""
    rows = replication.with_columns(plan=pl.lit("equal"), mps=pl.lit(False), n_repeats=pl.lit(3),
                                    throughput_rps_sd=pl.col("throughput_rps") * 0.01).to_dicts()  # fmt: skip
    one = next(r for r in rows if r["model"] == "opt125m" and r["replicas"] == 1)
    for mps, rps in ((False, 18.0), (True, 20.0)):
        rows.append({**one, "replicas": 4, "batch_per_replica": 256, "plan": "advisor", "mps": mps,
                     "throughput_rps": rps, "throughput_rps_sd": rps * 0.01, "latency_mean_s": 20.0})  # fmt: skip
    rows.append({**{k: None for k in one}, "model": "opt1.3b", "family": "OPT", "params": "1.3B", "plan": "advisor",
                 "mps": True, "status": "not_measured", "reason": "not measured yet: no result file"})  # fmt: skip
    return frame(rows)


def test_replication_figures_show_the_advisors_plan_beside_the_equal_split(plans: pl.DataFrame) -> None:
    """Figures 5-7 gain the advisor's plan as series of their own; Figure 5's caption gives each plan's gain
    over one instance with its 95% CI and the best plan per model."""
    chart, cap = figures.replication_tradeoff(plans)
    spec, data = chart.to_dict(), dataset(chart)
    assert spec["layer"][1]["encoding"]["shape"]["field"] == "how"
    mine = data.filter(pl.col("model") == "OPT-125M").sort("throughput_rps")
    assert mine["how"].to_list() == ["equal split"] * 3 + ["advisor plan", "advisor plan, MPS"]
    assert mine["setup"].to_list()[-2:] == ["advisor 4×256", "advisor 4×256 MPS"]
    gains = next(line for line in cap.splitlines() if "Gain over one instance" in line)
    ratio = stats.ratio_ci_of({"n": 3, "mean": 20.0, "sd": 0.2}, {"n": 3, "mean": 10.0, "sd": 0.1})
    assert f"advisor 4×256 MPS {ratio['ratio']:.3f} [{ratio['ci_lo']:.3f}, {ratio['ci_hi']:.3f}]" in gains
    assert "OPT-125M: ×2 1.414 [" in gains and "largest mean: advisor 4×256 MPS (a gain: its CI excludes 1)" in gains
    assert "OPT-1.3B: ×2 1.414 [" in gains and gains.index("OPT-125M:") < gains.index("OPT-1.3B:")  # by size
    assert "OPT-1.3B advisor plan MPS: not measured yet" in cap
    slower = plans.with_columns(
        throughput_rps=pl.when(pl.col("model") == "opt2.7b", pl.col("replicas") == 2).then(5.0)
        .otherwise(pl.col("throughput_rps")), throughput_rps_sd=pl.lit(0.05))  # fmt: skip
    _, slow_cap = figures.replication_tradeoff(slower)
    assert "OPT-2.7B: ×2 0.500 [" in slow_cap
    assert "; largest mean: one instance (every other run's CI below 1)" in slow_cap
    assert "the batching advisor's plan" in cap and "OPT-125M: 4×256, OPT-125M: 4×256 MPS" in cap
    bars, _ = figures.replication_gpu_util(plans)
    enc = bars.to_dict()["layer"][0]["encoding"]
    assert enc["color"]["sort"] == ["×1", "×2", "×3", "advisor 4×256", "advisor 4×256 MPS"]
    assert enc["color"]["title"] == "Replicas (plan)"


def test_cpu_runs_have_no_telemetry_and_still_render(cpu_sweep: pl.DataFrame, tmp_path: Path) -> None:
    for name in ("sm_metrics", "power", "dram_bandwidth", "energy_per_token", "util_throughput"):
        chart, cap = FIGURES[name].draw(cpu_sweep)
        assert "no GPU telemetry (CPU engine)" in cap, name
        data = dataset(chart)
        if name == "util_throughput":  # the throughput panel still has its points
            assert set(data["panel"]) == {"Throughput"}
        else:
            assert data.height == 0
    for name in ("power", "sm_metrics"):  # empty plots (log2 axis, no points) still render
        chart, cap = FIGURES[name].draw(cpu_sweep)
        png = figures.save(chart, cap, tmp_path / f"cpu_{name}")[0]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_figure_saves_and_is_json_safe(
    sweep: pl.DataFrame, families_summary: pl.DataFrame, outlen_summary: pl.DataFrame, replication: pl.DataFrame,
    tmp_path: Path,
) -> None:  # fmt: skip
    for name, (chart, cap) in all_figures(sweep, families_summary, outlen_summary, replication).items():
        json.dumps(chart.to_dict(), allow_nan=False)  # no inf/NaN in any spec
        assert cap.startswith("**") and "Differs from the paper" in cap, name
        out = figures.save(chart, cap, tmp_path / name)
        assert out[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert out[3].read_text() == cap


def test_caption_names_each_point_that_measured_fewer_requests(sweep: pl.DataFrame) -> None:
    """A model's own rounds_per_batch (models.<name>.workload): its small batches are named with their counts."""
    fewer = sweep.with_columns(
        n_ok=pl.when((pl.col("model") == "opt1.3b") & (pl.col("batch_size") <= 2))
        .then(pl.col("batch_size") * 64)
        .otherwise(pl.col("n_ok"))
    )
    _, cap = figures.throughput_latency(fewer)
    assert "Requests per point: 500, except OPT-1.3B b=1: 64; OPT-1.3B b=2: 128\n" in cap
    everyone = sweep.with_columns(n_ok=pl.when(pl.col("batch_size") <= 2).then(16).otherwise(pl.col("n_ok")))
    assert "Requests per point: 500, except b=1: 16; b=2: 16\n" in figures.throughput_latency(everyone)[1]
    assert "Requests per point: 500\n" in figures.throughput_latency(sweep)[1]  # one count: as before
    small = everyone.filter(pl.col("batch_size") <= 4).with_columns(
        n_ok=pl.max_horizontal(16, pl.col("batch_size") * 8)
    )
    assert "Requests per point: 32, except b=1: 16; b=2: 16\n" in figures.throughput_latency(small)[1]  # not the mode


def test_points_of_two_gpu_models_are_told_apart_in_figure_1_and_its_caption() -> None:
    """A 2-GPU host lent as H200 may run on H100: a curve never joins points of two GPU models, each point
    names its GPU, and the caption says which model ran where."""
    h200 = "NVIDIA H200"
    rows = [run("opt125m", b) for b in (1, 8)] + [run("opt125m", b, tp=2, gpu=h200) for b in (1, 8)]
    rows += [run("opt2.7b", b, tp=2, gpu=h200) for b in (1, 8)]
    chart, text = figures.throughput_latency(frame(rows))
    data = dataset(chart)
    assert set(data["series"]) == {f"OPT-125M · 1 GPU · {GPU}", f"OPT-125M · 2 GPU · {h200}",
                                   f"OPT-2.7B · 2 GPU · {h200}"}  # fmt: skip
    assert set(zip(data["gpus"], data["gpu_model"], strict=True)) == {(f"1 · {GPU}", GPU), (f"2 · {h200}", h200)}
    assert f"Hardware: **mixed GPU models**, which model ran on which: {GPU}: OPT-125M on 1 GPU; " \
           f"{h200}: OPT-125M on 2 GPUs, OPT-2.7B on 2 GPUs" in text  # fmt: skip
    assert "Each point's GPU model is in its marker's legend entry and tooltip" in text
    one_gpu = [run("opt125m", b) for b in (1, 8)] + [run("opt2.7b", b, gpu=h200) for b in (1, 8)]
    _, other = figures.util_throughput(frame(one_gpu))  # a figure without a GPU encoding claims none
    assert "which model ran on which" in other and "tooltip" not in other
    _, one = figures.throughput_latency(frame([run("opt125m", b) for b in (1, 8)]))
    assert f"Hardware: {GPU}\n" in one and "mixed" not in one
    assert "gpu_model" not in dataset(figures.throughput_latency(frame([run("opt125m", 1)]))[0]).columns


def test_caption_gives_each_jobs_gpu_ids_where_jobs_held_different_gpus() -> None:
    """Two one-GPU jobs side by side on a 2-GPU host: the caption shows that they held different GPUs."""
    rows = [{**run("opt125m", b), "gpu_ids": "0"} for b in (1, 8)] + [{**run("opt2.7b", b), "gpu_ids": "1"}
                                                                       for b in (1, 8)]  # fmt: skip
    rows += [{**run("opt2.7b", b, tp=2), "gpu_ids": "0,1"} for b in (1, 8)]
    _, text = figures.throughput_latency(frame(rows))
    assert ("GPU ids (the `CUDA_VISIBLE_DEVICES` each job held): 0: OPT-125M on 1 GPU; 0,1: OPT-2.7B on 2 GPUs; "
            "1: OPT-2.7B on 1 GPU") in text  # fmt: skip
    _, one = figures.throughput_latency(frame([{**run("opt125m", b), "gpu_ids": "0"} for b in (1, 8)]))
    assert "GPU ids" not in one
