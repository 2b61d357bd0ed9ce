"""Figures: model names and their order (the paper's names, by model size), the run selection every figure
starts from (measured runs, finite values, one GPU, the all-at-once workload, the largest batch) and the
names of a replication run's plan.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import polars as pl

from slmserve.analysis import complete
from slmserve.config import rate_label

# How the paper names its model families (Figure 2 left), keyed by the prefix of a config model key.
FAMILY_NAMES = {"opt": "OPT", "llama": "LLaMA", "mpt": "MPT", "gptj": "GPT-J", "gpt-j": "GPT-J"}


# --- model names and order ------------------------------------------------------------------------


def _params_value(text: str | None) -> float:
    """``"125M"`` -> 1.25e8, ``"opt1.3b"`` -> 1.3e9; inf when no size is found (sorted last)."""
    m = re.search(r"(\d+(?:\.\d+)?)\s*([mb])", (text or "").lower())
    return float(m[1]) * (1e6 if m[2] == "m" else 1e9) if m else math.inf


def display_name(model: str, family: str | None = None, params: str | None = None) -> str:
    """The paper's name of a model: ``OPT-1.3B``, ``LLaMA-7B``, ``GPT-J-6B`` (from family and params,
    else from a config key such as ``opt1.3b``); the key itself when neither works."""
    if family and params:
        return f"{family}-{params}"
    m = re.fullmatch(r"([a-z-]+?)-?(\d+(?:\.\d+)?[mb])", model.lower())
    if m:
        return f"{FAMILY_NAMES.get(m[1], m[1].upper())}-{(params or m[2]).upper()}"
    return model


def model_names(df: pl.DataFrame) -> dict[str, tuple[str, float]]:
    """Config model key -> (display name, parameter count)."""
    if "model" not in df.columns:
        return {}
    cols = [c for c in ("model", "family", "params") if c in df.columns]
    out: dict[str, tuple[str, float]] = {}
    for row in df.select(cols).unique(maintain_order=True).iter_rows(named=True):
        key, family, params = row["model"], row.get("family"), row.get("params")
        if key is None or (key in out and not family):
            continue
        out[key] = (display_name(key, family, params), _params_value(params or key))
    return out


def named(df: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """``df`` with ``model`` replaced by the display name, and the names ordered by model size."""
    names = model_names(df)
    if not names:
        return df, []
    order = [name for name, _ in sorted(set(names.values()), key=lambda t: (t[1], t[0]))]
    mapping = {k: v[0] for k, v in names.items()}
    return df.with_columns(pl.col("model").cast(pl.String).replace(mapping)), order


# --- run selection --------------------------------------------------------------------------------


def ok_runs(summary: pl.DataFrame) -> pl.DataFrame:
    summary = complete(summary)
    return summary.filter(pl.col("status") == "ok") if "status" in summary.columns else summary


def finite(df: pl.DataFrame, cols: Iterable[str]) -> pl.DataFrame:
    """Rows where every column of ``cols`` is present, non-null and (for floats) finite. All-null columns
    (dtype Null, as in a frame of CPU runs) become Float64, so that altair can type them."""
    df = df.with_columns(pl.col(c).cast(pl.Float64) for c, t in df.schema.items() if t == pl.Null)
    conds = []
    for c in cols:
        if c not in df.columns:
            return df.head(0)
        cond = pl.col(c).is_not_null()
        if df.schema[c].is_float():
            cond = cond & pl.col(c).is_finite()
        conds.append(cond)
    return df.filter(*conds) if conds else df


def one_gpu(summary: pl.DataFrame) -> pl.DataFrame:
    return summary.filter(pl.col("tp") == 1) if "tp" in summary.columns else summary


def sent_at_once() -> pl.Expr:
    """Rows whose requests were all sent at once: arrival rate inf (or not recorded)."""
    rate = pl.col("arrival_rate").cast(pl.Float64)
    return rate.is_null() | rate.is_infinite()


def main_workload(runs: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """The batch-sweep workload: all requests at once (arrival rate inf) and, when several output lengths
    are present, the longest (the paper's 256). Returns the rows and a note on what was left out."""
    n = runs.height
    if "arrival_rate" in runs.columns and n and runs.select(sent_at_once().any()).item():
        runs = runs.filter(sent_at_once())
    out = None
    if "output_len" in runs.columns and runs["output_len"].n_unique() > 1:
        out = runs["output_len"].max()
        runs = runs.filter(pl.col("output_len") == out)
    if runs.height == n:
        return runs, []
    what = f"all-at-once runs with {out} output tokens" if out is not None else "all-at-once runs"
    return runs, [f"Only the {what} are plotted; {n - runs.height} runs of other workloads are left out."]


def _no_preemption() -> pl.Expr:
    """True where a run's preemption count is known to be 0; false where vLLM preempted or the count is unknown
    (null: a repeat's /metrics read failed, :func:`slmserve.analysis.points`)."""
    return (pl.col("preemptions") == 0).fill_null(False)


def largest_batch(runs: pl.DataFrame, by: Sequence[str]) -> pl.DataFrame:
    """Per group of ``by``: the run with the largest batch among those known to run without preemptions
    (:func:`_no_preemption`); a group with none of those gets its largest batch."""
    clean = _no_preemption() if "preemptions" in runs.columns else pl.lit(False)
    return (
        runs.with_columns(_clean=clean)
        .sort(["_clean", "batch_size"], descending=[True, True])
        .group_by(list(by), maintain_order=True)
        .first()
        .drop("_clean")
    )


def rate_name(rate: float | None) -> str:
    return rate_label(math.inf if rate is None else rate)


# --- replication plans (named in captions and in Figures 5-7) -------------------------------------


def plan_size(row: Mapping[str, Any]) -> str:
    """``4×256``: a replication run's replicas × batch per replica (``?`` where the summary has none)."""
    n, b = row.get("replicas"), row.get("batch_per_replica")
    return f"{'?' if n is None else n}×{'?' if b is None else b}"


def mps_label(row: Mapping[str, Any]) -> str:
    """`` MPS`` where a replication run's replicas ran under NVIDIA MPS."""
    return " MPS" if row.get("mps") else ""
