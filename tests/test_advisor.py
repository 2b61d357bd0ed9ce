"""The batching advisor: the choice on synthetic summaries, the memory arithmetic against hand values, and
its table and figure on the committed quick results."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest
import yaml

from slmserve import advisor, capacity, replication
from slmserve.advisor import Settings
from slmserve.server import InfeasibleError
from tests.conftest import ROOT

QUICK = ROOT / "results/quick"
MODELS = yaml.safe_load((ROOT / "config/config.yaml").read_text())["models"]
OPT125M = capacity.load_config(ROOT / "config/models/opt-125m")


def _summary(rows: list[tuple]) -> pl.DataFrame:
    """Rows of (model, batch, throughput, ci_lo, ci_hi, latency_mean_s), measured on one GPU, all at once;
    a throughput of None makes an infeasible point."""
    cols = ["model", "batch_size", "throughput_rps", "throughput_rps_ci_lo", "throughput_rps_ci_hi", "latency_mean_s"]
    df = pl.DataFrame(rows, schema=cols, orient="row")
    return df.with_columns(
        tp=pl.lit(1),
        status=pl.when(pl.col("throughput_rps").is_null()).then(pl.lit("infeasible")).otherwise(pl.lit("ok")),
        arrival_rate=pl.lit(math.inf),
        input_len=pl.lit(100),
        output_len=pl.lit(20),
        preemptions=pl.lit(0.0),
        latency_p99_s=pl.col("latency_mean_s") * 2,
    )


# throughput rises to a plateau of 40 at batch 16; latency grows with the batch
CURVE = [(1, 10.0), (2, 19.0), (4, 30.0), (8, 38.0), (16, 40.0), (32, 39.5)]


@pytest.fixture
def summary() -> pl.DataFrame:
    return _summary([("m", b, t, None, None, float(i + 1)) for i, (b, t) in enumerate(CURVE)])


def _one(frame: pl.DataFrame, model: str = "m") -> dict:
    return frame.filter(pl.col("model") == model).row(0, named=True)


@pytest.mark.parametrize(("fraction", "batch"), [(0.95, 8), (0.9, 8), (0.96, 16), (0.7, 4), (1.0, 16)])
def test_smallest_batch_reaching_the_fraction_of_the_plateau(summary: pl.DataFrame, fraction: float, batch: int):
    row = _one(advisor.advise(summary, {}, {}, settings=Settings(fraction=fraction)))
    assert row["plateau_rps"] == 40.0 and row["plateau_batch"] == 16
    assert row["target_rps"] == pytest.approx(fraction * 40)
    assert row["chosen_batch"] == batch and row["chosen_rps"] == dict(CURVE)[batch]
    assert row["chosen_latency_s"] == [b for b, _ in CURVE].index(batch) + 1
    assert row["choice_uncertain"] is None  # one repeat: no CI
    assert row["note"] is None  # batch 32 falls below the plateau: a plateau inside the sweep


def test_plateau_only_over_measured_one_gpu_all_at_once_points(summary: pl.DataFrame) -> None:
    others = pl.concat([
        summary.head(1).with_columns(tp=pl.lit(2), batch_size=pl.lit(64), throughput_rps=pl.lit(100.0)),
        summary.head(1).with_columns(arrival_rate=pl.lit(10.0), batch_size=pl.lit(64), throughput_rps=pl.lit(90.0)),
        summary.head(1).with_columns(status=pl.lit("failed"), batch_size=pl.lit(128), throughput_rps=pl.lit(80.0)),
    ])  # fmt: skip
    row = _one(advisor.advise(pl.concat([summary, others], how="vertical_relaxed"), {}, {}))
    assert (row["plateau_rps"], row["chosen_batch"]) == (40.0, 8)


def test_latency_bound(summary: pl.DataFrame) -> None:
    # batches 1, 2, 4 have a mean latency <= 3.5 s: none reaches 95% of the plateau, 4 reaches 70%
    row = _one(advisor.advise(summary, {}, {}, settings=Settings(latency_bound_s=3.5)))
    assert row["chosen_batch"] is None and row["plateau_rps"] == 40.0  # the bound does not lower the plateau
    assert row["note"] == "no point with latency_mean_s <= 3.5 s reaches the target"
    row = _one(advisor.advise(summary, {}, {}, settings=Settings(fraction=0.7, latency_bound_s=3.5)))
    assert row["chosen_batch"] == 4 and row["latency_bound_s"] == 3.5
    # another column: latency_p99_s = 2 x mean, so only batches 1 and 2 are within 4 s
    row = _one(advisor.advise(summary, {}, {}, settings=Settings(0.4, 4.0, "latency_p99_s")))
    assert row["chosen_batch"] == 2 and row["chosen_latency_s"] == 4.0
    row = _one(advisor.advise(summary, {}, {}, settings=Settings(latency_bound_s=0.5)))
    assert row["note"] == "no point with latency_mean_s <= 0.5 s"


@pytest.mark.parametrize("column", ["throughput_rps", "batch_size", "latency_p99_s"])
def test_a_missing_column_is_named(summary: pl.DataFrame, column: str) -> None:
    settings = Settings(latency_column="latency_p99_s")
    with pytest.raises(ValueError, match=rf"advisor: summary has no column '{column}' \(needed: .*latency_p99_s"):
        advisor.advise(summary.drop(column), {}, {}, settings=settings)


def test_a_model_without_a_measured_point_gets_a_row_with_a_note(summary: pl.DataFrame) -> None:
    infeasible = _summary([("big", 1, None, None, None, None), ("big", 2, None, None, None, None)])
    frame = advisor.advise(pl.concat([summary, infeasible], how="diagonal_relaxed"), {}, {}, models=["m", "later"])
    assert frame["model"].to_list() == ["m", "later", "big"]
    for model in ("big", "later"):
        row = _one(frame, model)
        assert row["note"] == "no measured one-GPU point" and row["chosen_batch"] is None and row["plateau_rps"] is None
    md = advisor.to_markdown(frame)
    assert "| later | – | 0.95 | – | none | – |" in md and md.count("| no measured one-GPU point |") == 2


def test_uncertain_when_the_cis_straddle_the_target() -> None:
    def row(lo4: float, hi4: float) -> dict:
        s = _summary([("m", 2, 20.0, 19.0, 21.0, 1.0), ("m", 4, 30.0, lo4, hi4, 2.0), ("m", 8, 31.0, 30.5, 31.5, 3.0)])
        return _one(advisor.advise(s, {}, {}, settings=Settings(fraction=0.95)))

    # plateau 31 [30.5, 31.5]: the target lies in [28.975, 29.925]; batch 4's CI is above it, batch 2's below
    sure = row(30.0, 30.4)
    assert sure["chosen_batch"] == 4 and sure["choice_uncertain"] is False
    assert (sure["plateau_ci_lo"], sure["plateau_ci_hi"], sure["chosen_ci_lo"]) == (30.5, 31.5, 30.0)
    assert row(28.0, 32.0)["choice_uncertain"] is True  # batch 4 may fall short of the target
    s = _summary([("m", 2, 29.0, 27.0, 31.0, 1.0), ("m", 4, 30.0, 29.9, 30.1, 2.0), ("m", 8, 31.0, 30.9, 31.1, 3.0)])
    assert _one(advisor.advise(s, {}, {}))["choice_uncertain"] is True  # batch 2 may reach it too
    # one repeat at batch 1 (no CI) leaves the verdict open only where no known CI decides it
    b1 = ("m", 1, 10.0, None, None, 0.5)
    s = _summary(
        [b1, ("m", 2, 20.0, 19.0, 21.0, 1.0), ("m", 4, 30.0, 28.0, 32.0, 2.0), ("m", 8, 31.0, 30.5, 31.5, 3.0)]
    )
    assert _one(advisor.advise(s, {}, {}))["choice_uncertain"] is True  # batch 4 may fall short
    s = _summary(
        [b1, ("m", 2, 20.0, 19.0, 21.0, 1.0), ("m", 4, 30.0, 30.0, 30.4, 2.0), ("m", 8, 31.0, 30.5, 31.5, 3.0)]
    )
    assert _one(advisor.advise(s, {}, {}))["choice_uncertain"] is None  # batch 1 might qualify: unknown


def test_a_batch_without_a_measured_throughput_is_named_and_leaves_the_choice_uncertain() -> None:
    """Batch 8 not measured yet (or failed): the advisor chose 16 with no word, though 8 may reach the target."""
    s = _summary([("m", 4, 30.0, 29.0, 31.0, 2.0), ("m", 8, 39.0, 38.5, 39.5, 3.0), ("m", 16, 40.0, 39.8, 40.2, 4.0),
                  ("m", 32, 39.5, 39.0, 40.0, 5.0)])  # fmt: skip
    sure = _one(advisor.advise(s, {}, {}))
    assert sure["chosen_batch"] == 8 and sure["choice_uncertain"] is False and sure["note"] is None
    for status in ("not_measured", "failed"):
        at8 = pl.col("batch_size") == 8
        gap = s.with_columns(status=pl.when(at8).then(pl.lit(status)).otherwise("status"),
                             throughput_rps=pl.when(at8).then(None).otherwise("throughput_rps"))  # fmt: skip
        r = _one(advisor.advise(gap, {}, {}))
        assert r["chosen_batch"] == 16 and r["choice_uncertain"] is True
        assert r["note"] == f"b=8 has no measured throughput ({status})"


def test_a_model_whose_weights_are_not_counted_gets_its_choice_and_a_note() -> None:
    """LLaMA-7B in the sweep: the advisor chose its batch, then stopped with "param_count knows OPT only",
    naming no model; now the row keeps the choice and its note says why the memory columns are empty."""
    s = _summary([("llama7b", 4, 30.0, 29.0, 31.0, 2.0), ("llama7b", 8, 40.0, 39.5, 40.5, 3.0),
                  ("llama7b", 16, 39.0, 38.0, 40.0, 4.0)])  # fmt: skip
    cfg = capacity.load_config(ROOT / "config/models/llama-7b")
    advice = advisor.advise(s, {"llama7b": cfg}, {})
    r = _one(advice, "llama7b")
    assert r["chosen_batch"] == 8 and r["kv_analytic_gb"] is None
    assert r["note"] == "no memory figures for llama7b: param_count knows OPT only, not 'llama'"
    chart, _ = advisor.figure(s.with_columns(family=pl.lit("LLaMA"), params=pl.lit("7B")), advice,
                              {"llama7b": cfg}, {})  # fmt: skip
    assert chart.to_dict()["title"].startswith("Batching advisor")  # drawn, with no KV need


def test_the_largest_batch_that_fits_is_said_only_where_the_next_size_does_not_fit() -> None:
    """Batches up to 16, then 64, which does not fit: 32 was never measured, so 16 is not "the largest that
    fits"."""
    rows = [("m", b, float(10 * b), 10 * b - 1.0, 10 * b + 1.0, 1.0) for b in (4, 8, 16)]
    s = _summary([*rows, ("m", 64, None, None, None, None)])
    assert _one(advisor.advise(s, {}, {}))["note"] == f"{advisor.EDGE_NOTE}; b=64 does not fit the KV cache"
    s = _summary([*rows, ("m", 32, None, None, None, None)])
    assert _one(advisor.advise(s, {}, {}))["note"] == advisor.FITS_NOTE.format(batch=32)


def test_the_plateau_point_chosen_is_not_uncertain_of_reaching_its_own_fraction() -> None:
    """Batches 1, 2, 4 at 10, 20, 40 [30, 50] req/s: 4 is the plateau and the choice; compared with itself it
    was "uncertain" at any fraction near 1, though batch 2's CI lies far below every target."""
    s = _summary([("m", 1, 10.0, 9.0, 11.0, 1.0), ("m", 2, 20.0, 19.0, 21.0, 2.0), ("m", 4, 40.0, 30.0, 50.0, 3.0)])
    for f in (0.95, 1.0):
        r = _one(advisor.advise(s, {}, {}, settings=Settings(fraction=f)))
        assert r["chosen_batch"] == 4 and r["choice_uncertain"] is False, f


def test_settings_and_schema_agree() -> None:
    schema = yaml.safe_load((ROOT / "config/schemas/config.schema.yaml").read_text())
    props = schema["properties"]["experiments"]["properties"]["advisor"]["properties"]
    assert tuple(props["latency_column"]["enum"]) == advisor.LATENCY_COLUMNS
    assert Settings(**{k: v["default"] for k, v in props.items()}) == Settings()
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="fraction must be in"):
            Settings(fraction=bad)


# --- memory ---------------------------------------------------------------------------------------

W = capacity.weight_bytes(OPT125M)
B = 2 * 2 * 768 * 12  # OPT-125M: fp16 x (key, value) x hidden x layers = 36864 bytes per token
WHOLE = {"status": "ok", "kv_cache_tokens": 100_000, "block_size": 16, "gpu_memory_utilization": 0.9}
BUDGET = {"status": "ok", "budget_gb": 36.0, "gpu_memory_utilization": 0.45}  # so the GPU has 80 GB


def test_memory_against_hand_values() -> None:
    assert capacity.kv_bytes_per_token(OPT125M) == B and W == 250_478_592
    gpu = advisor.gpu_memory_bytes(BUDGET)
    assert gpu == pytest.approx(80e9)
    m = advisor.memory(OPT125M, WHOLE, 8, 100, 20, gpu)
    share = 0.9 * 80e9  # S = u x M
    per_token = (share - W) / 100_000  # b_probe = (S - W) / C
    assert m["share_gb"] == pytest.approx(72.0) and m["kv_bytes_per_token_probe"] == pytest.approx(per_token)
    assert m["kv_analytic_gb"] == pytest.approx(8 * 120 * B / 1e9)  # 0.03538944 GB
    assert m["kv_analytic_admission_gb"] == pytest.approx(8 * 100 * B / 1e9)
    # whole KV blocks of 16: 120 tokens -> 128, 100 -> 112
    assert m["kv_probe_gb"] == pytest.approx(8 * 128 * per_token / 1e9)
    assert m["kv_probe_admission_gb"] == pytest.approx(8 * 112 * per_token / 1e9)
    assert m["kv_whole_gb"] == pytest.approx((share - W) / 1e9)
    assert m["freed_frac"] == pytest.approx(1 - 1024 / 100_000)
    assert m["freed_gb"] == pytest.approx((share - W) * (1 - 1024 / 100_000) / 1e9)
    # every server holds F = S - C x b besides its KV cache: 68.3 GB of this made-up probe, so one fits
    assert m["replicas_fit"] == math.floor(share / (share - 100_000 * B + 1024 * B)) == 1
    assert m["share_from"].startswith("0.9 x GPU memory 80.00 GB")


def test_memory_without_a_budget_probe_or_a_probe() -> None:
    m = advisor.memory(OPT125M, WHOLE, 8, 100, 20)  # S = W + C x b: b_probe = b
    assert m["kv_bytes_per_token_probe"] == pytest.approx(B) and m["share_gb"] == pytest.approx((W + 1e5 * B) / 1e9)
    assert m["kv_probe_gb"] == pytest.approx(8 * 128 * B / 1e9) and m["replicas_fit"] == math.floor(
        (W + 1e5 * B) / (W + 1024 * B)
    )
    assert "no budget probe" in m["share_from"]
    bare = advisor.memory(OPT125M, None, 8, 100, 20)
    assert bare["kv_analytic_gb"] == pytest.approx(8 * 120 * B / 1e9) and "kv_probe_gb" not in bare
    assert advisor.gpu_memory_bytes(None) is None and advisor.gpu_memory_bytes({"budget_gb": None}) is None
    # a batch beyond the KV cache frees a negative amount and fits no replica
    over = advisor.memory(OPT125M, WHOLE, 1024, 100, 20, 80e9)
    assert over["freed_frac"] == pytest.approx(1 - 1024 * 128 / 100_000) and over["freed_gb"] < 0
    assert over["replicas_fit"] == 0


def _replicas_hold(k: int, probe: dict, gpu: float, per_token: int, need: float) -> bool:
    """Whether ``k`` replicas, each given its KV cache by replication.replica_kv_bytes, hold ``need`` bytes."""
    try:
        return replication.replica_kv_bytes(probe, probe["gpu_memory_utilization"] / k, gpu, per_token) >= need
    except InfeasibleError:
        return False


def test_replicas_fit_is_what_the_replicas_kv_caches_hold(quick: tuple) -> None:
    """The advisor's count agrees with the KV cache replication gives each replica (replica_kv_bytes, which
    matched vLLM's own: 97,947 predicted against 97,936 measured tokens for two OPT-2.7B replicas, quick
    profile): ``replicas_fit`` replicas of the batch hold it without preemption, one more does not. It
    charged each replica the probe's overhead in proportion to its KV need, and counted 10 OPT-125M
    replicas of 256 (9 fit) and 2 OPT-2.7B replicas of 128 (1 fits)."""
    _, configs, whole, budget, models = quick
    checked = 0
    for m in models:
        probe, gpu = whole[m], advisor.gpu_memory_bytes(budget[m])
        per_token = capacity.kv_bytes_per_token(configs[m])
        for batch in (32, 64, 128, 256, 512):
            n = advisor.memory(configs[m], probe, batch, 512, 256, gpu)["replicas_fit"]
            need = batch * capacity.blocks_rounded(768, probe["block_size"]) * per_token
            args = (probe, gpu, per_token, need)
            assert (n == 0 or _replicas_hold(n, *args)) and not _replicas_hold(n + 1, *args), (m, batch, n)
            checked += 1
    assert checked == 15


# --- the committed quick results ------------------------------------------------------------------


@pytest.fixture
def quick() -> tuple:
    if not (QUICK / "summary/sweep.parquet").exists():
        pytest.skip("results/quick not in this checkout")
    models = ["opt125m", "opt1.3b", "opt2.7b"]
    whole = capacity.read_probes([QUICK / f"capacity/{m}-whole.json" for m in models])
    budget = capacity.read_probes([QUICK / f"capacity/{m}-36gb.json" for m in models])
    summary = pl.read_parquet(QUICK / "summary/sweep.parquet")
    return summary, advisor.model_configs(MODELS, models), whole, budget, models


def test_quick_results(quick: tuple, tmp_path: Path) -> None:
    summary, configs, whole, budget, models = quick
    frame = advisor.advise(summary, configs, whole, budget, Settings(), models)
    # n = 3: OPT-125M reaches 95% of its plateau (at 512) at 256; OPT-1.3B peaks at 256 (at 512 it preempts)
    assert dict(zip(frame["model"], frame["chosen_batch"], strict=True)) == {"opt125m": 256, "opt1.3b": 256,
                                                                             "opt2.7b": 256}  # fmt: skip
    r = _one(frame, "opt1.3b")
    assert r["plateau_rps"] == pytest.approx(56.45, abs=0.01) and r["kv_cache_tokens"] == 373_008
    assert r["share_gb"] == pytest.approx(0.9 * 36 / json.loads((QUICK / "capacity/opt1.3b-36gb.json").read_text())[
        "gpu_memory_utilization"])  # fmt: skip
    assert r["kv_analytic_gb"] == pytest.approx(256 * 768 * 196_608 / 1e9)  # 38.65 GB
    assert r["freed_frac"] == pytest.approx(1 - 256 * 768 / 373_008) and r["replicas_fit"] == 1
    assert r["note"] is None and _one(frame, "opt125m")["note"] == advisor.EDGE_NOTE  # 125M's plateau at 512
    assert _one(frame, "opt2.7b")["note"] == advisor.FITS_NOTE.format(batch=512)  # b=512 is infeasible
    assert _one(frame, "opt125m")["replicas_fit"] == 9  # 10 would give each 176,880 KV tokens of 196,608 needed
    # 90% of the plateau: OPT-1.3B and 2.7B need half the batch
    lower = advisor.advise(summary, configs, whole, budget, Settings(fraction=0.9), models)
    assert lower["chosen_batch"].to_list() == [256, 128, 128]
    # what `make replot` committed is what the function writes now
    committed = ROOT / "paper_figures/quick/advisor.csv"
    if committed.exists():
        assert committed.read_text() == advisor.to_csv(frame)
        assert (ROOT / "paper_figures/quick/advisor.md").read_text() == advisor.to_markdown(frame)
    chart, caption = advisor.figure(summary, frame, configs, whole, budget)
    assert "OPT-1.3B: batch 256 at 56.4 [55.8, 57.1] req/s" in caption
    spec = chart.to_dict()
    assert len(spec["hconcat"]) == 2 and spec["title"].startswith("Batching advisor")


def test_one_models_row_from_its_own_sweep_is_its_row_of_the_table(quick: tuple) -> None:
    """The advisor's plan job (rule replication_plan) advises one model from its one-GPU sweep's result files:
    the same row as advisor.csv holds for it, and the plan it gives (slmserve.replication.advisor_plan)."""
    summary, configs, whole, budget, models = quick
    table = advisor.advise(summary, configs, whole, budget, Settings(), models)
    for model in models:
        runs = sorted((QUICK / "runs" / model).glob("tp1-*/bs*.requests.parquet"))
        mine = advisor.advise_model(model, runs, MODELS, [QUICK / f"capacity/{model}-whole.json"],
                                    [QUICK / f"capacity/{model}-36gb.json"], Settings())  # fmt: skip
        assert advisor.to_csv(mine) == advisor.to_csv(table.filter(pl.col("model") == model)), model
    plans = {m: replication.advisor_plan(table, m, 4) for m in models}
    assert plans == {"opt125m": replication.AdvisorPlan(4, 256), "opt1.3b": replication.AdvisorPlan(1, 256),
                     "opt2.7b": replication.AdvisorPlan(1, 256)}  # fmt: skip


def test_probes_of_another_gpu_than_the_sweep_give_the_analytic_memory_only(summary: pl.DataFrame) -> None:
    """An H200 sweep beside the H100's probes (the paper profile's OPT-6.7B): the chosen batch is the
    sweep's, the memory it frees cannot be the H100's; the note says why the probe columns are empty."""
    h100 = {"provenance": {"gpu_models": ["NVIDIA H100 80GB HBM3"]}}
    whole, budget = {"m": {**WHOLE, **h100}}, {"m": {**BUDGET, **h100}}
    cfgs = {"m": OPT125M}
    same = _one(advisor.advise(summary.with_columns(gpu_model=pl.lit("NVIDIA H100 80GB HBM3")), cfgs, whole, budget))
    assert same["kv_probe_gb"] is not None and same["note"] is None
    other = _one(advisor.advise(summary.with_columns(gpu_model=pl.lit("NVIDIA H200")), cfgs, whole, budget))
    assert other["chosen_batch"] == same["chosen_batch"] == 8
    assert other["kv_probe_gb"] is None and other["replicas_fit"] is None and other["share_gb"] is None
    assert other["kv_analytic_gb"] == pytest.approx(same["kv_analytic_gb"])
    assert other["note"] == ("probes measured on NVIDIA H100 80GB HBM3, the sweep on NVIDIA H200: memory from the "
                             "analytic formula only")  # fmt: skip
    unknown = _one(advisor.advise(summary, cfgs, whole, budget))  # no gpu_model column: nothing to compare
    assert unknown["kv_probe_gb"] == pytest.approx(same["kv_probe_gb"])
    unnamed = {"m": {**WHOLE, "provenance": {"gpu_models": []}}}  # NVML named no GPU: not another GPU
    assert _one(advisor.advise(summary.with_columns(gpu_model=pl.lit("NVIDIA H200")), cfgs, unnamed))["note"] is None


def test_the_figure_draws_a_probe_only_where_the_table_used_it(quick: tuple) -> None:
    """A model whose probes advise left out (another GPU's: no share_gb in its row) gets the analytic KV need
    in the figure too, not the other GPU's probe the table refused."""
    summary, configs, whole, budget, _ = quick
    advice = advisor.advise(summary, configs, whole, budget)
    refused = advice.with_columns(share_gb=pl.when(pl.col("model") == "opt125m").then(None).otherwise("share_gb"))
    points = advisor.sweep_points(summary, Settings())
    gpu = {m: advisor.gpu_memory_bytes(p) for m, p in budget.items()}
    data = advisor._curve(points, refused, configs, whole, gpu).filter(pl.col("batch_size") == 256)
    kv = dict(zip(data["model"], data["kv_gb"], strict=True))
    assert kv["opt125m"] == pytest.approx(256 * 768 * capacity.kv_bytes_per_token(configs["opt125m"]) / 1e9)
    used = advisor.memory(configs["opt1.3b"], whole["opt1.3b"], 256, 512, 256, gpu["opt1.3b"])
    assert kv["opt1.3b"] == pytest.approx(used["kv_probe_gb"])
