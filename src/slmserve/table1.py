"""Table 1: the largest batch per model, from the paper, the KV-cache formula and the capacity probes.

:func:`frame` reads the probes (``capacity/{model}-{whole,<budget>gb}.json``) into one row per model;
:func:`table` formats it (one string column per source), :func:`to_csv` and :func:`to_markdown` write it,
the latter with a note on GPU, engine, memory budget, KV-cache capacity and the rule for "fits"
(:data:`RULE_NOTE`; the arithmetic is :mod:`slmserve.capacity`'s).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from slmserve import capacity
from slmserve.figures import engines, hardware, model_names, values

RULE_NOTE = (
    "Two rules for when a batch fits the KV cache beside the fp16 weights. Admission: every request's prompt "
    "({input_len} tokens) is resident (vLLM's rule for admitting a request; output blocks are allocated as tokens "
    "are generated, and when they run out vLLM preempts, which the runs record). No preemption: every request's "
    "prompt and all its output ({input_len} + {output_len} tokens) are resident at once. Powers of two, capped at 512."
)
RULE_NOTE_PLACEHOLDER = "[Rule for 'fits': to be stated by the caller.]"
NO_BUDGET = "budget"  # the budget columns' label when no budget is configured
_MISSING = "–"


# --- the frame of the probes ----------------------------------------------------------------------


def _profiles(*probes: Mapping[str, Any]) -> str | None:
    """The configuration profiles the probes ran in: a probe does not depend on the workload, so one
    profile's probes may stand in another's Table 1 (its note says so)."""
    found = {str(p["provenance"]["config"].get("profile")) for p in probes if "config" in (p.get("provenance") or {})}
    return ", ".join(sorted(found)) or None


def _row(
    model: str, entry: Mapping[str, Any], whole: Mapping[str, Any], budget: Mapping[str, Any],
    budget_gb: float | None, workload: Mapping[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """One model's row: the paper's value, the analytic ones for ``budget_gb``, the probes' (empty if none)."""
    cfg = capacity.load_config(entry.get("config"))
    analytic = {}
    if budget_gb:
        analytic = capacity.analytic_max_batch(cfg, budget_gb, workload["input_len"], workload["output_len"])
    prov = whole.get("provenance") or budget.get("provenance") or {}
    return {
        "model": model,
        "params": entry.get("params"),
        "weights_gb": round(capacity.weight_bytes(cfg) / 1e9, 2),
        "paper_max_batch": capacity.PAPER_TABLE1.get(model),
        "analytic_max_batch": analytic.get("admission"),
        "analytic_max_batch_no_preemption": analytic.get("no_preemption"),
        "measured_max_batch_budget": budget.get("max_batch_admission"),
        "measured_max_batch_no_preemption_budget": budget.get("max_batch_no_preemption"),
        "measured_max_batch_whole": whole.get("max_batch_admission"),
        "measured_max_batch_no_preemption_whole": whole.get("max_batch_no_preemption"),
        "kv_tokens_budget": budget.get("kv_cache_tokens"),
        "kv_tokens_whole": whole.get("kv_cache_tokens"),
        "whole_memory_share": whole.get("gpu_memory_utilization"),
        # a probe whose server the engine refused: its reason, not a missing probe
        "unsupported_budget": budget.get("reason") if budget.get("status") == "unsupported" else None,
        "unsupported_whole": whole.get("reason") if whole.get("status") == "unsupported" else None,
        "budget_gb": budget_gb,
        "gpu_model": (", ".join(prov.get("gpu_models") or []) or f"CPU: {prov.get('cpu_model')}") if prov else None,
        "engine": prov.get("engine"),
        "engine_version": prov.get("engine_version"),
        "probe_profile": _profiles(whole, budget),
        "fits": (prov.get("config") or {}).get("fits"),
        "input_len": workload.get("input_len"),
        "output_len": workload.get("output_len"),
    }


def frame(
    whole: Sequence[str],
    budget: Sequence[str],
    models: Mapping[str, Any],
    budget_gb: float | None,
    workload: Mapping[str, Any],
    planned: Sequence[str] = (),
) -> pl.DataFrame:
    """One row per model from the probes with the whole GPU (``whole``) and with ``budget_gb``
    (``budget``); a model of ``planned`` without probes gets the paper's and the analytic values only."""
    probes_whole, probes_budget = capacity.read_probes(whole), capacity.read_probes(budget)
    rows = [
        _row(m, models[m], probes_whole.get(m, {}), probes_budget.get(m, {}), budget_gb, workload)
        for m in dict.fromkeys([*planned, *probes_whole, *probes_budget])
    ]
    return pl.DataFrame(rows, infer_schema_length=None)


# --- the table as text ----------------------------------------------------------------------------


def _weights(gb: float | None) -> str:
    if gb is None:
        return _MISSING
    return f"{gb * 1000:.0f} MB" if gb < 1 else f"{gb:.1f} GB"


def _batch(value: float | None) -> str:
    return _MISSING if value is None or (isinstance(value, float) and not math.isfinite(value)) else str(int(value))


def _budget(df: pl.DataFrame) -> str:
    budgets = values(df, "budget_gb")
    return "/".join(f"{b:g}" for b in budgets) + " GB" if budgets else NO_BUDGET


# (column, header): the batch columns of Table 1, after Model, Parameters and fp16 weights; "{b}" is the budget.
BATCH_COLUMNS = (
    ("paper_max_batch", "paper (A100 40 GB)"),
    ("analytic_max_batch", "analytic {b}: admission"),
    ("analytic_max_batch_no_preemption", "analytic {b}: no preemption"),
    ("measured_max_batch_budget", "measured {b} emulated: admission"),
    ("measured_max_batch_no_preemption_budget", "measured {b} emulated: no preemption"),
    ("measured_max_batch_whole", "measured whole GPU: admission"),
    ("measured_max_batch_no_preemption_whole", "measured whole GPU: no preemption"),
)
# The CSV's extra columns (the Markdown gives them in the note).
KV_COLUMNS = (
    ("kv_tokens_budget", "KV-cache tokens ({b} emulated)"),
    ("kv_tokens_whole", "KV-cache tokens (whole GPU)"),
)


def _shown(budget: str, pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (column, header) pairs a table shows: without a budget its columns would be empty, so none of them."""
    return [(key, h) for key, h in pairs if budget != NO_BUDGET or "{b}" not in h]


def _columns(budget: str, pairs: Sequence[tuple[str, str]]) -> list[str]:
    return ["Model", "Parameters", "fp16 weights"] + [h.format(b=budget) for _, h in pairs]


def _text_row(
    r: Mapping[str, Any], columns: Sequence[str], names: Mapping[str, tuple[str, float]],
    pairs: Sequence[tuple[str, str]],
) -> dict:  # fmt: skip
    name, size = names.get(r["model"], (r["model"], math.inf))
    cells = [name, r.get("params") or _MISSING, _weights(r.get("weights_gb"))]
    cells += [_batch(r.get(key)) for key, _ in pairs]
    return {**dict(zip(columns, cells, strict=True)), "_size": size}


def table(df: pl.DataFrame, extra: Sequence[tuple[str, str]] = ()) -> pl.DataFrame:
    """Table 1 as strings, ordered by model size: Model, Parameters, fp16 weights, the paper's maximum
    batch (A100 40 GB), then by each rule (admission, no preemption) the analytic one for the memory budget
    and the measured ones (budget emulated; whole GPU); then the ``extra`` (column, header) pairs. Without a
    memory budget the budget's columns are left out."""
    budget = _budget(df)
    pairs = _shown(budget, (*BATCH_COLUMNS, *extra))
    columns = _columns(budget, pairs)
    names = model_names(df)
    rows = [_text_row(r, columns, names, pairs) for r in df.iter_rows(named=True)]
    if not rows:
        return pl.DataFrame(schema=dict.fromkeys(columns, pl.String))
    return pl.DataFrame(rows).sort("_size", "Model", maintain_order=True).drop("_size")


def to_csv(df: pl.DataFrame) -> str:
    """Every column of the Markdown table and the KV-cache capacities in tokens."""
    return table(df, KV_COLUMNS).write_csv()


def _measured_note(df: pl.DataFrame, budget: str) -> str:
    """What the columns mean and where they were measured."""
    engine = ", ".join(engines(df)) if "engine" in df.columns else ""
    if budget == NO_BUDGET:  # e.g. the CPU engine: the budget columns are empty
        measured = "measured = the largest batch that fits vLLM's reported KV-cache capacity with the whole memory"
    else:
        a100 = " (emulating the A100's 36 GB)" if budget == "36 GB" else ""
        shares = sorted({f"{100 * u:.0f}%" for u in df["whole_memory_share"].drop_nulls()}) \
            if "whole_memory_share" in df.columns else []  # fmt: skip
        measured = (
            f"analytic = the paper's KV-cache formula for a {budget} budget; measured = the largest batch that fits "
            f"vLLM's reported KV-cache capacity with the server limited to {budget}{a100}, and with the whole GPU"
            + (f" ({', '.join(shares)} of its memory)" if shares else "")
        )
    return (
        "Maximum batch size (powers of two, capped at 512). Paper: its Table 1 (vLLM 0.1.7, A100 40 GB, 90% of the "
        f"memory = 36 GB for vLLM). Here: {hardware(df)}, {engine or 'unknown engine'}; {measured}."
    )


def _not_probed(df: pl.DataFrame, budget: str, names: Mapping[str, tuple[str, float]]) -> list[str]:
    """A line naming each model with a probe still missing, and which."""
    if "measured_max_batch_whole" not in df.columns:
        return []
    todo, refused = [], []
    for r in df.iter_rows(named=True):
        kinds = ((budget, "unsupported_budget"), ("whole GPU", "unsupported_whole"))
        said = [f"{what}: {r[key]}" for what, key in kinds if r.get(key)]
        if said:
            refused.append(f"{names[r['model']][0]} ({'; '.join(said)})")
        probes = [budget] if budget != NO_BUDGET and r.get("measured_max_batch_budget") is None \
            and not r.get("unsupported_budget") else []  # fmt: skip
        probes += ["whole GPU"] if r["measured_max_batch_whole"] is None and not r.get("unsupported_whole") else []
        if probes:
            todo.append(f"{names[r['model']][0]} ({', '.join(probes)})")
    lines = [f"Not measured yet (no KV-cache probe result): {', '.join(todo)}."] if todo else []
    return lines + ([f"Not served by the engine (probe result): {'; '.join(refused)}."] if refused else [])


def _profiles_line(df: pl.DataFrame, names: Mapping[str, tuple[str, float]]) -> list[str]:
    if "probe_profile" not in df.columns or df["probe_profile"].drop_nulls().n_unique() <= 1:
        return []
    runs = df.filter(pl.col("probe_profile").is_not_null()).group_by("probe_profile", maintain_order=True)
    where = "; ".join(f"{key[0]}: {', '.join(names[m][0] for m in rows['model'])}" for key, rows in runs)
    return [f"Probes measured in different configuration profiles (same server settings): {where}."]


def _kv_line(df: pl.DataFrame, budget: str, names: Mapping[str, tuple[str, float]]) -> list[str]:
    keys = [key for key, _ in _shown(budget, KV_COLUMNS)]  # the CSV's rule: no budget, no budget column
    kv = "; ".join(
        f"{names[r['model']][0]}: {' / '.join(_batch(r.get(k)) for k in keys)}"
        for r in df.iter_rows(named=True)
        if any(r.get(k) is not None for k in keys)
    )
    which = "whole GPU" if budget == NO_BUDGET else f"{budget} / whole GPU"
    return [f"KV-cache capacity in tokens ({which}): {kv}."] if kv else []


def _matches(df: pl.DataFrame, column: str) -> tuple[list[str], list[str]]:
    """The models whose paper value equals ``column``'s, and those where it differs (``name paper vs x``)."""
    if column not in df.columns or "paper_max_batch" not in df.columns:
        return [], []
    names = model_names(df)
    rows = [r for r in df.iter_rows(named=True) if r["paper_max_batch"] is not None and r[column] is not None]
    same = [names[r["model"]][0] for r in rows if r["paper_max_batch"] == r[column]]
    differ = [
        f"{names[r['model']][0]} {r['paper_max_batch']} vs {r[column]}"
        for r in rows
        if r["paper_max_batch"] != r[column]
    ]
    return same, differ


def _paper_rule(df: pl.DataFrame, names: Mapping[str, tuple[str, float]]) -> list[str]:
    """Which rule the paper's Table 1 follows (by the analytic values), and where its text disagrees."""
    adm, adm_diff = _matches(df, "analytic_max_batch")
    nop, nop_diff = _matches(df, "analytic_max_batch_no_preemption")
    n = len(adm) + len(adm_diff)
    if not n:
        return []
    line = (
        f"The paper's Table 1 values equal the analytic admission rule for {len(adm)} of {n} models"
        + (f" (differs: {', '.join(adm_diff)})" if adm_diff else "")
        + f" and the no-preemption rule for {len(nop)} of {n}"
        + (f" (paper vs no preemption: {', '.join(nop_diff)})" if nop_diff else "")
        + "."
    )
    lens = values(df, "input_len"), values(df, "output_len")
    if len(lens[0]) == 1 and len(lens[1]) == 1 and nop_diff:
        i, o = lens[0][0], lens[1][0]
        line += (
            f" The paper's text (section 3.2) says each request needs up to {i + o} tokens ({i} + {o}) of KV cache, "
            "the no-preemption rule, which its Table 1 does not follow."
        )
    return [line]


def _configured_rule(df: pl.DataFrame) -> list[str]:
    """The rule the probes' configuration uses to pick a batch for the runs (engine.fits)."""
    rules = values(df, "fits")
    return (
        [f"Rule the workflow uses for its runs (engine.fits in the probes' configuration): {', '.join(rules)}."]
        if rules
        else []
    )


def to_markdown(df: pl.DataFrame, rule_note: str = RULE_NOTE_PLACEHOLDER) -> str:
    """Table 1 as a Markdown table and a note under it: GPU, engine, memory budget, the probes still
    missing, KV-cache capacity and ``rule_note`` (the rule for "fits": :data:`RULE_NOTE` with the workload)."""
    text = table(df)
    head = "| " + " | ".join(text.columns) + " |"
    align = "|" + "|".join([":---", ":---"] + ["---:"] * (text.width - 2)) + "|"
    body = ["| " + " | ".join(row) + " |" for row in text.iter_rows()]
    budget, names = _budget(df), model_names(df)
    notes = [
        _measured_note(df, budget), *_not_probed(df, budget, names), *_profiles_line(df, names),
        *_kv_line(df, budget, names), rule_note, *_paper_rule(df, names), *_configured_rule(df),
    ]  # fmt: skip
    return "\n".join([head, align, *body, "", *notes]) + "\n"
