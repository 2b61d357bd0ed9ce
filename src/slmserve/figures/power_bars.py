"""Figure 4: average GPU power per model at its largest batch on one GPU, and the caption's rule for that
batch (runs without preemptions preferred).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import altair as alt
import polars as pl

from slmserve.figures.captions import caption, ci_cols, point_notes, values, warmup_counted
from slmserve.figures.names import finite, largest_batch, main_workload, model_names, named, ok_runs, one_gpu
from slmserve.figures.shapes import bar_chart

# --- Figure 4: power at the largest batch ---------------------------------------------------------


def power(summary: pl.DataFrame) -> tuple[alt.LayerChart, str]:
    """Figure 4: average power (W) per model at its largest measured feasible batch on one GPU (runs
    without preemptions preferred), each bar labelled with that batch size."""
    frame = one_gpu(summary)
    runs, left_out = main_workload(ok_runs(frame))
    candidates = finite(runs, ["power_w_mean"])
    runs = largest_batch(candidates, ["model"]) if runs.height else runs
    runs, order = named(runs)
    data = finite(runs, ["power_w_mean"]).select(
        "model", "batch_size", "power_w_mean", *ci_cols(runs, ["power_w_mean"]),
        label=pl.lit("bs ") + pl.col("batch_size").cast(pl.String),
    )  # fmt: skip
    chart = bar_chart(
        data, y="power_w_mean", y_title="Average power (W)", order=order, text="label",
        title="Average GPU power at the largest batch (Figure 4)",
    )  # fmt: skip
    notes = [
        *left_out, *_power_rule(candidates, runs),
        "Power: mean of NVML power readings over the window (on Hopper the driver's ~1 s moving average).",
        *point_notes(finite(runs, ["power_w_mean"]), ["power_w_mean"]),
    ]  # fmt: skip
    return chart, caption(
        frame, "Figure 4: average GPU power (W) at the largest batch per model", notes, ["power_w_mean"]
    )


def _power_rule(candidates: pl.DataFrame, chosen: pl.DataFrame) -> list[str]:
    """Figure 4's rule for "largest batch", the batch it chose per model and the larger runs it skipped."""
    fits = f" (the sweep's configured fit rule, engine.fits: {', '.join(values(candidates, 'fits'))})" \
        if values(candidates, "fits") else ""  # fmt: skip
    rule = (
        f"Batch rule: among the runs measured on one GPU{fits}, the largest batch without preemptions (the "
        "no-preemption rule applied to the measured runs; a run whose count is unknown does not count as without); "
        "a model with no run known to be without preemptions gets its largest batch. The paper used the Table 1 "
        "maximum of a 40 GB A100."
    )
    if chosen.is_empty():
        return [rule, "Chosen: none."]
    names = model_names(candidates)
    size = {name: params for name, params in names.values()}
    chosen = chosen.sort(pl.col("model").replace_strict(size, default=math.inf, return_dtype=pl.Float64))
    chosen_at = {r["model"]: r for r in chosen.iter_rows(named=True)}
    picked = ", ".join(f"{m}: batch {r['batch_size']}" + ("" if r["preemptions"] == 0 else f" ({_preemptions(r)})")
                       for m, r in chosen_at.items())  # fmt: skip
    larger = [
        r for r in candidates.sort("model", "batch_size").iter_rows(named=True)
        if names[r["model"]][0] in chosen_at and r["batch_size"] > chosen_at[names[r["model"]][0]]["batch_size"]
    ]  # fmt: skip
    skipped = ", ".join(f"{names[r['model']][0]} b={r['batch_size']} ({_preemptions(r)})" for r in larger)
    unknown = any(r["preemptions"] is None for r in larger)
    what = "with preemptions or an unknown count" if unknown else "with preemptions"
    counted = warmup_counted([*chosen_at.values(), *larger])
    return [rule, f"Chosen: {picked}.", f"Skipped (larger batches {what}): {skipped or 'none'}.{counted}"]


def _preemptions(row: Mapping[str, Any]) -> str:
    """``12 preemptions`` (the mean over repeats), or that the count is unknown."""
    return "preemption count unknown" if row.get("preemptions") is None else f"{row['preemptions']:g} preemptions"
