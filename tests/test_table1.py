"""Table 1: the frame of the capacity probes, and its CSV and Markdown."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from slmserve import table1
from tests.conftest import ROOT

GPU = "NVIDIA H100 80GB HBM3"
OPT = {"opt125m": "opt-125m", "opt1.3b": "opt-1.3b", "opt2.7b": "opt-2.7b", "opt6.7b": "opt-6.7b", "opt13b": "opt-13b"}


@pytest.fixture
def table() -> pl.DataFrame:
    rows = [  # admission, then no preemption: analytic, budget, whole
        ("opt125m", "125M", 0.25, 512, 512, 512, 512, 512, 512, 512, 400000, 900000),
        ("opt1.3b", "1.3B", 2.6, 256, 256, 128, 256, 128, 512, 256, 110000, 230000),
        ("opt2.7b", "2.7B", 5.4, 128, 128, 64, 128, 64, 256, 128, 60000, 140000),
        ("opt6.7b", "6.7B", 13.4, 64, 64, 32, 64, 32, 128, 64, 45000, 120000),
        ("opt13b", "13B", 26.0, 16, 16, 8, None, None, 64, 32, 12000, 60000),
    ]
    cols = ["model", "params", "weights_gb", "paper_max_batch", "analytic_max_batch",
            "analytic_max_batch_no_preemption", "measured_max_batch_budget", "measured_max_batch_no_preemption_budget",
            "measured_max_batch_whole", "measured_max_batch_no_preemption_whole", "kv_tokens_budget",
            "kv_tokens_whole"]  # fmt: skip
    df = pl.DataFrame(rows, schema=cols, orient="row")
    return df.with_columns(budget_gb=pl.lit(36.0), gpu_model=pl.lit(GPU), engine=pl.lit("vllm"),
                           engine_version=pl.lit("0.26.0"), input_len=pl.lit(512), output_len=pl.lit(256),
                           fits=pl.lit("admission"))  # fmt: skip


def test_table1_frame_from_probe_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probes = {"opt1.3b": (951_312, 256), "opt13b": (10_000, 16)}
    whole, budget = [], []
    for model, (tokens, batch) in probes.items():
        for kind, mult in (("whole", 2), ("36gb", 1)):
            p = tmp_path / f"{model}-{kind}.json"
            profile = "quick" if model == "opt1.3b" else "paper"  # one profile's probes in another's table
            p.write_text(json.dumps({"model": model, "status": "ok", "kv_cache_tokens": tokens * mult,
                                     "max_batch_admission": batch, "max_batch_no_preemption": None,
                                     "provenance": {"gpu_models": ["NVIDIA H100 80GB HBM3"], "engine": "vllm",
                                                    "engine_version": "0.26.0",
                                                    "config": {"profile": profile}}}))  # fmt: skip
            (whole if kind == "whole" else budget).append(str(p))
    models = {m: {"config": f"config/models/{OPT[m]}", "params": m[3:].upper()} for m in probes}
    monkeypatch.chdir(ROOT)
    frame = table1.frame(whole, budget, models, 36, {"input_len": 512, "output_len": 256})
    row = frame.filter(pl.col("model") == "opt1.3b").row(0, named=True)
    assert row["paper_max_batch"] == 256 and row["analytic_max_batch"] == 256
    assert row["measured_max_batch_budget"] == 256 and row["kv_tokens_whole"] == 2 * 951_312
    assert row["weights_gb"] == pytest.approx(2.63, abs=0.01)
    md = table1.to_markdown(frame, table1.RULE_NOTE.format(input_len=512, output_len=256))
    assert "| OPT-1.3B |" in md and "NVIDIA H100 80GB HBM3" in md and "prompt (512 tokens)" in md
    assert "No preemption: every request's prompt and all its output (512 + 256 tokens)" in md
    assert frame["probe_profile"].to_list() == ["quick", "paper"]
    assert "Probes measured in different configuration profiles (same server settings): quick: OPT-1.3B; " \
           "paper: OPT-13B." in md  # fmt: skip
    one = table1.to_markdown(frame.with_columns(probe_profile=pl.lit("paper")))
    assert "different configuration profiles" not in one


def test_table1_keeps_a_planned_model_without_probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = tmp_path / "opt125m-whole.json"
    probe.write_text(json.dumps({"model": "opt125m", "status": "ok", "kv_cache_tokens": 2_056_000,
                                 "max_batch_admission": 512, "max_batch_no_preemption": None,
                                 "provenance": {"gpu_models": ["NVIDIA H100 80GB HBM3"], "engine": "vllm",
                                                "engine_version": "0.26.0"}}))  # fmt: skip
    models = {m: {"config": f"config/models/{OPT[m]}", "params": m[3:].upper()} for m in ("opt125m", "opt13b")}
    monkeypatch.chdir(ROOT)
    frame = table1.frame([str(probe)], [], models, 36, {"input_len": 512, "output_len": 256},
                                  planned=["opt125m", "opt13b"])  # fmt: skip
    assert frame["model"].to_list() == ["opt125m", "opt13b"]
    big = frame.filter(pl.col("model") == "opt13b").row(0, named=True)
    assert (big["paper_max_batch"], big["analytic_max_batch"]) == (16, 16)
    assert big["measured_max_batch_whole"] is None and big["gpu_model"] is None
    table = table1.table(frame)
    assert table.filter(pl.col("Model") == "OPT-13B")["measured whole GPU: admission"].item() == "–"
    md = table1.to_markdown(frame)
    # OPT-125M has its whole-GPU probe only, OPT-13B none: each is named with what it lacks
    assert "NVIDIA H100 80GB HBM3" in md
    assert "Not measured yet (no KV-cache probe result): OPT-125M (36 GB), OPT-13B (36 GB, whole GPU)." in md


def test_table1_without_a_budget_leaves_its_columns_out(table: pl.DataFrame) -> None:
    """budget_gb null (config/h200.yaml, the CPU engine): no empty budget columns, the KV line names the whole GPU."""
    none = table.with_columns(budget_gb=pl.lit(None, pl.Float64), kv_tokens_budget=pl.lit(None, pl.Int64))
    lines = table1.to_markdown(none).splitlines()
    assert lines[0] == ("| Model | Parameters | fp16 weights | paper (A100 40 GB) | measured whole GPU: admission "
                        "| measured whole GPU: no preemption |")  # fmt: skip
    assert "| OPT-1.3B | 1.3B | 2.6 GB | 256 | 512 | 256 |" in lines
    assert any(ln.startswith("KV-cache capacity in tokens (whole GPU): OPT-125M: 900000; OPT-1.3B: 230000;")
               for ln in lines)  # fmt: skip
    csv = pl.read_csv(table1.to_csv(none).encode())
    assert "KV-cache tokens (whole GPU)" in csv.columns and not [c for c in csv.columns if "budget" in c]


def test_table1(table: pl.DataFrame) -> None:
    md = table1.to_markdown(table, rule_note="A batch fits when all its requests run at once.")
    lines = md.splitlines()
    assert lines[0] == (
        "| Model | Parameters | fp16 weights | paper (A100 40 GB) | analytic 36 GB: admission "
        "| analytic 36 GB: no preemption | measured 36 GB emulated: admission | measured 36 GB emulated: no preemption "
        "| measured whole GPU: admission | measured whole GPU: no preemption |"
    )
    assert "| OPT-125M | 125M | 250 MB | 512 | 512 | 512 | 512 | 512 | 512 | 512 |" in lines
    assert "| OPT-1.3B | 1.3B | 2.6 GB | 256 | 256 | 128 | 256 | 128 | 512 | 256 |" in lines
    assert "| OPT-13B | 13B | 26.0 GB | 16 | 16 | 8 | – | – | 64 | 32 |" in lines
    assert [ln.split(" | ")[0] for ln in lines[2:7]] == ["| OPT-125M", "| OPT-1.3B", "| OPT-2.7B", "| OPT-6.7B",
                                                          "| OPT-13B"]  # fmt: skip
    assert GPU in md and "vllm 0.26.0" in md and "36 GB" in md
    assert "A batch fits when all its requests run at once." in md
    assert table1.RULE_NOTE_PLACEHOLDER in table1.to_markdown(table)
    csv = pl.read_csv(table1.to_csv(table).encode())
    assert csv.columns[3] == "paper (A100 40 GB)"
    assert csv.filter(pl.col("Model") == "OPT-1.3B")["paper (A100 40 GB)"].to_list() == [256]
    one = csv.filter(pl.col("Model") == "OPT-1.3B").row(0, named=True)
    assert one["measured 36 GB emulated: no preemption"] == "128"
    assert str(one["KV-cache tokens (whole GPU)"]) == "230000"


def test_table1_says_which_rule_the_paper_follows(table: pl.DataFrame) -> None:
    """The paper's Table 1 follows the admission rule; its text's 768 tokens per request would give the
    no-preemption values, and the note says where the two disagree."""
    md = table1.to_markdown(table)
    assert (
        "equal the analytic admission rule for 5 of 5 models and the no-preemption rule for 1 of 5 (paper vs "
        "no preemption: OPT-1.3B 256 vs 128, OPT-2.7B 128 vs 64, OPT-6.7B 64 vs 32, OPT-13B 16 vs 8)" in md
    )
    assert "up to 768 tokens (512 + 256) of KV cache, the no-preemption rule, which its Table 1 does not follow" in md
    assert "Rule the workflow uses for its runs (engine.fits in the probes' configuration): admission." in md


def test_table1_reads_both_rules_from_the_probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = []
    for kind, adm, nop in (("whole", 512, 256), ("36gb", 256, 128)):
        p = tmp_path / f"opt1.3b-{kind}.json"
        p.write_text(json.dumps({"model": "opt1.3b", "status": "ok", "kv_cache_tokens": 1000,
                                 "max_batch_admission": adm, "max_batch_no_preemption": nop,
                                 "provenance": {"gpu_models": [GPU], "config": {"fits": "admission"}}}))  # fmt: skip
        paths.append(str(p))
    monkeypatch.chdir(ROOT)
    models = {"opt1.3b": {"config": "config/models/opt-1.3b", "params": "1.3B"}}
    frame = table1.frame(paths[:1], paths[1:], models, 36, {"input_len": 512, "output_len": 256})
    row = frame.row(0, named=True)
    assert (row["measured_max_batch_whole"], row["measured_max_batch_no_preemption_whole"]) == (512, 256)
    assert (row["measured_max_batch_budget"], row["measured_max_batch_no_preemption_budget"]) == (256, 128)
    assert (row["analytic_max_batch"], row["analytic_max_batch_no_preemption"]) == (256, 128)
    assert row["fits"] == "admission"
    assert "| OPT-1.3B | 1.3B | 2.6 GB | 256 | 256 | 128 | 256 | 128 | 512 | 256 |" in table1.to_markdown(frame)


def test_the_note_names_the_budget_and_whole_share_the_probes_had(table: pl.DataFrame) -> None:
    """The note said "emulating the A100's 36 GB" and "whole GPU (90%)" whatever the budget and share."""
    md = table1.to_markdown(table.with_columns(whole_memory_share=pl.lit(0.9)))
    assert "limited to 36 GB (emulating the A100's 36 GB), and with the whole GPU (90% of its memory)" in md
    md = table1.to_markdown(table.with_columns(budget_gb=pl.lit(20.0), whole_memory_share=pl.lit(0.8)))
    assert "limited to 20 GB, and with the whole GPU (80% of its memory)" in md and "A100's 36 GB" not in md
    assert "limited to 36 GB (emulating the A100's 36 GB), and with the whole GPU." in table1.to_markdown(table)


def test_a_probe_the_engine_refused_is_named_with_its_reason_not_as_missing(table: pl.DataFrame) -> None:
    refused = table.with_columns(
        measured_max_batch_whole=pl.when(pl.col("model") == "opt13b").then(None).otherwise("measured_max_batch_whole"),
        unsupported_whole=pl.when(pl.col("model") == "opt13b").then(pl.lit("architecture not supported")),
    )  # fmt: skip
    md = table1.to_markdown(refused)
    assert "Not served by the engine (probe result): OPT-13B (whole GPU: architecture not supported)." in md
    assert "Not measured yet (no KV-cache probe result): OPT-13B (36 GB)." in md  # its whole-GPU probe is a result
