"""Figures 5-7 and the extra on replication (replicas of one model sharing one GPU): throughput against
latency (Figure 5), GPU utilisation (Figure 6), power (Figure 7) and energy per output token (beyond the
paper), the equal split beside the batching advisor's plan, with or without MPS.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import altair as alt
import polars as pl

from slmserve import stats
from slmserve.analysis import CI_METRICS, NOT_MEASURED
from slmserve.figures.captions import NOT_MEASURED_NOTE, caption, ci_cols, energy_note, point_notes
from slmserve.figures.names import finite, model_names, mps_label, named, ok_runs, plan_size
from slmserve.figures.shapes import TRADEOFF, bar_chart, tradeoff_chart, window_ok

# --- Figures 5-7 and extra: replication ------------------------------------------------------------


def setup_label(row: Mapping[str, Any]) -> str:
    """A replication run's bar and legend label: the replica count for the paper's equal split (``×2``), the
    plan for the batching advisor's (``advisor 4×256``); `` MPS`` where the replicas ran under MPS."""
    base = f"advisor {plan_size(row)}" if row.get("plan") == "advisor" else f"×{row.get('replicas')}"
    return base + mps_label(row)


def _one_instance(row: Mapping[str, Any]) -> bool:
    """The reference of the gains: one replica at the one-GPU maximum batch (the equal split's ×1), no MPS."""
    return row.get("plan", "equal") == "equal" and row.get("replicas") == 1 and not row.get("mps")


def _with_setup(runs: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """``runs`` with ``setup`` (:func:`setup_label`) and ``how`` (equal split or advisor plan, MPS or not),
    and the setups in legend order: the equal split by replicas, then the advisor's plans."""
    rows = list(runs.iter_rows(named=True))
    setups = [setup_label(r) for r in rows]
    hows = [("advisor plan" if r.get("plan") == "advisor" else "equal split") + (", MPS" if r.get("mps") else "")
            for r in rows]  # fmt: skip
    keys = {s: (r.get("plan") == "advisor", r.get("mps") or False, r.get("replicas") or 0)
            for s, r in zip(setups, rows, strict=True)}  # fmt: skip
    order = sorted(keys, key=lambda s: keys[s])
    return runs.with_columns(setup=pl.Series(setups, dtype=pl.String), how=pl.Series(hows, dtype=pl.String)), order


def _plan_gains(runs: pl.DataFrame) -> list[str]:
    """Per model, each run's system throughput over one instance's (the equal split's one replica, no MPS):
    the ratio of means with its 95% CI (:func:`slmserve.stats.ratio_ci_of`, from the summary's n, mean and
    sd), and the run of the largest mean (older summaries without ``plan`` hold the equal split only)."""
    per = []
    size = {name: params for name, params in model_names(runs).values()}
    runs = runs.sort(pl.col("model").replace_strict(size, default=math.inf, return_dtype=pl.Float64),
                     maintain_order=True)  # fmt: skip
    for (model,), group in runs.group_by("model", maintain_order=True):
        rows = list(group.iter_rows(named=True))
        one = next((r for r in rows if _one_instance(r)), None)
        if one is None:
            per.append(f"{model}: no one-instance run to compare with")
            continue
        gains = []
        for r in rows:
            if not _one_instance(r):
                g = stats.ratio_ci_of(stats.summary_sample(r), stats.summary_sample(one))
                if g["ratio"] is not None:
                    gains.append((g, setup_label(r)))
        if not gains:
            continue
        text = ", ".join(f"{s} {g['ratio']:.3f}" + (f" [{g['ci_lo']:.3f}, {g['ci_hi']:.3f}]" if g["ci_lo"] is not None
                                                     else " (no CI)") for g, s in gains)  # fmt: skip
        best, name = max(gains, key=lambda t: t[0]["ratio"])
        lo = best["ci_lo"]
        if best["ratio"] <= 1:
            below = all(g["ci_hi"] is not None and g["ci_hi"] < 1 for g, _ in gains)
            verdict = "largest mean: one instance" + (" (every other run's CI below 1)" if below else "")
        else:
            said = "no CI" if lo is None else "a gain: its CI excludes 1" if lo > 1 else "its CI contains 1"
            verdict = f"largest mean: {name} ({said})"
        per.append(f"{model}: {text}; {verdict}")
    if not per:
        return []
    return ["Gain over one instance (system throughput / that of one replica at the one-GPU maximum batch, no MPS; "
            f"ratio of means, 95% CI by the delta method): {'; '.join(per)}."]  # fmt: skip


def _replica_setup_notes(summary: pl.DataFrame) -> list[str]:
    """How the measured replicas ran (columns ``start`` and ``mps`` of the summary, where it has them)."""
    if not {"start", "mps"} <= set(summary.columns):
        return []
    setups = ok_runs(summary).select("start", "mps").unique().sort("start", "mps").iter_rows(named=True)
    said = [
        ("started together, each with explicit KV-cache bytes from the probe" if r["start"] == "together"
         else "started one after another") + ("; under NVIDIA MPS" if r["mps"]
                                               else "; separate processes, time-sliced on the GPU (no MPS)")
        for r in setups
    ]  # fmt: skip
    return [f"Replica servers: {' | '.join(said)}."] if said else []


def _memory_note(summary: pl.DataFrame) -> str:
    """What memory the replicas split: the GPU's configured share, or an emulated smaller GPU's budget."""
    runs = ok_runs(summary)
    budgets = sorted(set(runs["memory_budget_gb"].drop_nulls())) if "memory_budget_gb" in runs.columns else []
    if not budgets:
        return "an equal share of the configured memory share"
    gb = " / ".join(f"{b:g} GB" for b in budgets)
    return f"an equal share of {gb} (engine.memory_budget_gb: a smaller GPU emulated, as the paper's 40 GB A100)"


def _replication_notes(summary: pl.DataFrame) -> list[str]:
    notes = [
        f"Replicas of one model share one GPU, each with {_memory_note(summary)}; the "
        "requests are split evenly and sent at once; latency = the largest replica mean (as in the paper).",
        "Throughput plotted: the system throughput = all replicas' completed requests / (last end - first send "
        "on the replicas' common clock). The paper summed each replica's own rate (throughput_sum_rps), which "
        "exceeds the system throughput when replicas finish at different times.",
    ]
    if "batch_per_replica" in summary.columns:
        names = model_names(summary)
        per = ok_runs(summary).sort(
            pl.col("model").map_elements(lambda m: names[m][1], return_dtype=pl.Float64), pl.col("replicas")
        )
        advised = per.filter(pl.col("plan") == "advisor") if "plan" in per.columns else per.head(0)
        per = per.filter(pl.col("plan") != "advisor") if "plan" in per.columns else per
        batches = ", ".join(
            f"{names[r['model']][0]} ×{r['replicas']}: {r['batch_per_replica']}" for r in per.iter_rows(named=True)
        )
        notes.append(f"Batch per replica = the largest one-GPU batch / replicas ({batches or 'none'}).")
        if "plan" in summary.columns and (summary["plan"] == "advisor").any():
            plans = ", ".join(
                f"{names[r['model']][0]}: {plan_size(r)}{mps_label(r)}" for r in advised.iter_rows(named=True)
            )
            notes.append(
                "Beyond the paper, the batching advisor's plan (slmserve.replication.advisor_plan; the advisor run on "
                "the model's one-GPU sweep, as in advisor.csv): max(1, min(replicas_fit, max_replicas)) replicas of "
                "its chosen batch, the memory split evenly, labelled 'advisor replicas×batch' "
                f"({plans or 'none measured'})."
            )
    notes += _replica_setup_notes(summary)
    if "status" in summary.columns:
        bad = summary.filter(pl.col("status") != "ok").sort(["model", "replicas"])
        names = model_names(summary)
        notes += [
            _unmeasured_name(r, names)
            + ": "
            + (
                NOT_MEASURED_NOTE
                if r["status"] == NOT_MEASURED
                else r["status"] + (f": {r['reason']}" if r.get("reason") else "")
            )
            for r in bad.iter_rows(named=True)
        ]
    return notes


def _unmeasured_name(row: Mapping[str, Any], names: Mapping[str, tuple[str, float]]) -> str:
    """``OPT-125M × 3 replicas`` or ``OPT-125M advisor plan MPS``: a replication run that was not measured."""
    model = names.get(row["model"], (row["model"],))[0]
    if row.get("plan") == "advisor":
        return f"{model} advisor plan{mps_label(row)}"
    return f"{model} × {row['replicas']} replicas"


def _system_vs_sum(runs: pl.DataFrame) -> list[str]:
    """Per model: system throughput and the sum of per-replica rates at each replica count."""
    if "throughput_sum_rps" not in runs.columns or runs["throughput_sum_rps"].is_null().all():
        return ["Sum of per-replica rates: not recorded in this summary."]
    per = []
    size = {name: params for name, params in model_names(runs).values()}
    runs = runs.sort(pl.col("model").replace_strict(size, default=math.inf, return_dtype=pl.Float64), "replicas")
    for (model,), rows in runs.group_by("model", maintain_order=True):
        pairs = ", ".join(
            f"{setup_label(r)} {r['throughput_rps']:.1f} / {r['throughput_sum_rps']:.1f}"
            for r in rows.iter_rows(named=True) if r["throughput_sum_rps"] is not None
        )  # fmt: skip
        per.append(f"{model}: {pairs}")
    return [f"System throughput / sum of per-replica rates (req/s): {'; '.join(per)}."]


def replication_tradeoff(summary: pl.DataFrame) -> tuple[alt.LayerChart, str]:
    """Figure 5: system throughput against latency per model, points labelled by the number of replicas."""
    runs, order = named(ok_runs(summary))
    runs, _ = _with_setup(finite(runs, TRADEOFF))
    data = runs.select(
        "model", "replicas", "throughput_rps", "latency_mean_s", "setup", "how", *ci_cols(runs, TRADEOFF),
        series=pl.concat_str("model", "how", separator=" / "),
    )  # fmt: skip
    several = runs["how"].n_unique() > 1  # the advisor's plan or MPS beside the equal split: a shape each
    chart = tradeoff_chart(
        data, title="Model replication: throughput and latency (Figure 5)", label="replicas", order=order,
        log_x=False, shape="how" if several else None, shape_title="Plan",
    )  # fmt: skip
    what = "Figure 5: system throughput vs mean latency with 1-3 replicas per model on one GPU, labels = replicas"
    if several:
        what += "; a line and marker per plan (the paper's equal split, the batching advisor's, with or without MPS)"
    notes = [*_replication_notes(summary), *_system_vs_sum(runs), *_plan_gains(runs), *point_notes(runs, TRADEOFF)]
    return chart, caption(summary, what, notes)


def _replication_bars(
    summary: pl.DataFrame, y: str, y_title: str, title: str, what: str, notes: Sequence[str] = ()
) -> tuple[alt.LayerChart, str]:
    runs, order = named(ok_runs(summary))
    runs = finite(runs, [y])
    energy = y == "energy_per_token_j"
    cis = ci_cols(runs, [y]) if y in CI_METRICS else []
    window = [window_ok(runs).alias("energy_window_ok")] if energy else []
    runs, setups = _with_setup(runs)
    data = runs.select("model", "replicas", "setup", y, *cis, *window)
    chart = bar_chart(
        data, y=y, y_title=y_title, title=title, order=order, group="setup", group_order=setups,
        group_title="Replicas" if all(s[1:].isdigit() for s in setups) else "Replicas (plan)",
        text_format=".2g" if energy else ".0f",
    )  # fmt: skip
    notes = [*_replication_notes(summary), *notes, *point_notes(runs, [y]), *(energy_note(runs) if energy else [])]
    return chart, caption(summary, what, notes, telemetry=[y])


def replication_gpu_util(summary: pl.DataFrame) -> tuple[alt.LayerChart, str]:
    """Figure 6: average GPU utilisation (%) per model and number of replicas."""
    return _replication_bars(
        summary, "gpu_util_mean", "Average GPU utilisation (%)", "GPU utilisation with replicas (Figure 6)",
        "Figure 6: average GPU utilisation, model × replicas on one GPU",
    )  # fmt: skip


def replication_power(summary: pl.DataFrame) -> tuple[alt.LayerChart, str]:
    """Figure 7: average power (W) per model and number of replicas."""
    return _replication_bars(
        summary, "power_w_mean", "Average power (W)", "GPU power with replicas (Figure 7)",
        "Figure 7: average GPU power (W), model × replicas on one GPU",
    )  # fmt: skip


def energy_per_token_replicas(summary: pl.DataFrame) -> tuple[alt.LayerChart, str]:
    """Beyond the paper: GPU energy per output token (J) per model and number of replicas."""
    return _replication_bars(
        summary, "energy_per_token_j", "GPU energy per output token (J)",
        "Energy per token with replicas (beyond the paper)", "Energy per output token, model × replicas on one GPU",
        ["Not in the paper. Energy: NVML's cumulative counter over the window / all replicas' output tokens."],
    )  # fmt: skip
