"""The batching advisor (after "Mind the Memory Gap", Recasens et al. 2025): the smallest batch that reaches
most of a model's throughput plateau, the KV-cache memory that batch needs and what that frees.

Inputs: a sweep summary (:mod:`slmserve.analysis`, one row per point, columns read by name), each model's
KV-cache probe with the whole GPU (``capacity/<model>-whole.json``; a probe with a GB budget, where there is
one, gives the GPU's memory; the rule reads those Table 1 makes, and a model without one, or whose probes ran
on another GPU model than its sweep, gets the analytic figures only) and its model config
(:mod:`slmserve.capacity`). :func:`advise` returns one row per model; :func:`to_csv`, :func:`to_markdown`
and :func:`figure` write it. Every quantity, defined once:

Choice (over a model's measured points, ``status == "ok"``, on one GPU, ``tp == 1``, with the all-at-once
workload: arrival rate inf and the longest output length, as :func:`slmserve.figures.main_workload`):

- ``plateau_rps`` = max over those points of ``throughput_rps`` (the mean over repeats), at batch
  ``plateau_batch``; ``plateau_ci_lo/hi`` = that point's 95% CI (null with one repeat).
- ``target_rps`` = ``fraction`` x ``plateau_rps``.
- eligible points = those points with ``<latency_column> <= latency_bound_s`` (all of them when the bound
  is null). The plateau is taken over all points, the bound does not lower it.
- ``chosen_batch`` = the smallest batch among the eligible points with ``throughput_rps >= target_rps``;
  null when none is (``note`` says why; it also says when the plateau is at the largest measured batch:
  where throughput may still rise, or, when a larger batch of the sweep is infeasible, the largest that
  fits). ``chosen_rps``, ``chosen_ci_lo/hi``, ``chosen_latency_s`` (the value of ``latency_column``) and
  ``chosen_preemptions`` are that point's.
- ``choice_uncertain``: true when the CIs overlap the target: the chosen batch's ``ci_lo`` is below
  ``fraction x plateau_ci_hi`` (it may fall short), or an eligible smaller batch's ``ci_hi`` reaches
  ``fraction x plateau_ci_lo`` (it may qualify too), whether or not another CI is missing; false when
  every one of those CIs is known and neither holds; null when neither holds and one is missing (one
  repeat).

Memory (``B`` = chosen batch, ``I``/``O`` = the point's prompt/output tokens; GB = 10^9 bytes):

- ``b`` = KV bytes per token, ``2 (fp16) x 2 (key, value) x hidden x layers`` (paper, section 2.1,
  :func:`slmserve.capacity.kv_bytes_per_token`); ``W`` = fp16 weight bytes (:func:`~slmserve.capacity.
  weight_bytes`).
- Analytic KV need: ``kv_analytic_gb = B x (I + O) x b`` (whole requests resident, no preemption) and
  ``kv_analytic_admission_gb = B x I x b`` (vLLM's admission rule: the prompts resident).
- Probe: ``C`` = ``kv_cache_tokens`` of the whole-GPU probe, ``s`` its ``block_size``, ``u`` its
  ``gpu_memory_utilization`` (the configured memory share). ``M`` = GPU memory = ``budget_gb x 10^9 / u_b``
  of a budget probe of the model (the runner set ``u_b = budget / M``). ``S`` = the memory share in bytes
  = ``u x M``; with no budget probe ``S = W + C x b`` (weights plus KV cache, the server's other memory
  unknown; ``share_from`` says which).
- ``b_probe`` = ``(S - W) / C``: the share's bytes beyond the weights per KV-cache token the probe
  reported (``>= b``: the excess is the server's activations and CUDA graphs, spread over the tokens).
- Probe KV need: ``kv_probe_gb = B x ceil((I + O) / s) x s x b_probe`` (tokens in whole blocks,
  :func:`slmserve.capacity.blocks_rounded`), and ``kv_probe_admission_gb`` with ``I`` for ``I + O``.
- ``kv_whole_gb`` = the whole-GPU KV cache = ``S - W = C x b_probe``.
- ``freed_gb = kv_whole_gb - kv_probe_gb``, ``freed_frac = freed_gb / kv_whole_gb = 1 - B x ceil((I + O)
  / s) x s / C`` (negative: the batch needs more than the KV cache holds, vLLM preempts).
- ``replicas_fit = floor(S / (F + B x ceil((I + O) / s) x s x b))``: servers of the chosen batch that fit the
  memory share without preemption, each holding ``F = S - C x b`` besides its KV cache (weights, activations,
  CUDA context and graphs, as the probe measured them; what :func:`slmserve.replication.replica_kv_bytes`
  leaves every replica). With no budget probe ``F = W``: the server's other memory is unknown, so more may
  be counted than fit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import altair as alt
import polars as pl

from slmserve import analysis, capacity
from slmserve.figures import caption, color_scale, display_name, main_workload, model_names, named, no_data

GB = 1e9
# The summary columns the advisor reads; the latency column is the configured one (latency_column).
REQUIRED = ("model", "tp", "batch_size", "status", "throughput_rps", "input_len", "output_len")
OPTIONAL = ("throughput_rps_ci_lo", "throughput_rps_ci_hi", "preemptions", "arrival_rate")
LATENCY_COLUMNS = ("latency_mean_s", "latency_p50_s", "latency_p99_s", "ttft_mean_s", "ttft_p50_s", "ttft_p99_s",
                   "tpot_mean_s")  # fmt: skip
_MISSING = "–"
EDGE_NOTE = "plateau at the largest measured batch: throughput may still rise beyond it"
FITS_NOTE = "plateau at the largest batch that fits: b={batch} does not fit the KV cache"
_F, _I, _S = pl.Float64(), pl.Int64(), pl.String()
# The columns of :func:`advise`, each defined in the module docstring.
SCHEMA: dict[str, pl.DataType] = {
    "model": _S, "plateau_rps": _F, "plateau_ci_lo": _F, "plateau_ci_hi": _F, "plateau_batch": _I, "fraction": _F,
    "target_rps": _F, "latency_column": _S, "latency_bound_s": _F, "chosen_batch": _I, "chosen_rps": _F,
    "chosen_ci_lo": _F, "chosen_ci_hi": _F, "chosen_latency_s": _F, "chosen_preemptions": _F,
    "choice_uncertain": pl.Boolean(), "note": _S, "input_len": _I, "output_len": _I, "kv_bytes_per_token": _I,
    "weights_gb": _F, "kv_analytic_gb": _F, "kv_analytic_admission_gb": _F, "kv_cache_tokens": _I, "block_size": _I,
    "share_gb": _F, "share_from": _S, "kv_bytes_per_token_probe": _F, "kv_probe_gb": _F, "kv_probe_admission_gb": _F,
    "kv_whole_gb": _F, "freed_gb": _F, "freed_frac": _F, "replicas_fit": _I,
}  # fmt: skip


@dataclass(frozen=True)
class Settings:
    """``experiments.advisor`` of the config: the share of the plateau to reach, an optional bound on a
    latency column of the summary (seconds)."""

    fraction: float = 0.95
    latency_bound_s: float | None = None
    latency_column: str = "latency_mean_s"

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise ValueError(f"advisor: fraction must be in (0, 1], not {self.fraction}")

    def bound_text(self) -> str:
        """``latency_mean_s <= 10 s``, or ``none``."""
        return "none" if self.latency_bound_s is None else f"{self.latency_column} <= {self.latency_bound_s:g} s"


def check_columns(summary: pl.DataFrame, settings: Settings, source: str = "summary") -> None:
    """Raise ValueError naming every column the advisor reads that ``summary`` lacks."""
    need = [*REQUIRED, settings.latency_column]
    missing = [c for c in need if c not in summary.columns]
    if missing:
        raise ValueError(
            f"advisor: {source} has no column {', '.join(map(repr, missing))} (needed: {', '.join(need)}; "
            f"latency_column = {settings.latency_column!r}, experiments.advisor.latency_column)"
        )


def sweep_points(summary: pl.DataFrame, settings: Settings, status: str | None = "ok") -> pl.DataFrame:
    """The points the advisor chooses from: measured (``status``; None: any), one GPU, all-at-once workload;
    the optional columns filled with nulls where absent."""
    check_columns(summary, settings)
    fill = [pl.lit(None, pl.Float64).alias(c) for c in OPTIONAL if c not in summary.columns]
    runs = summary.with_columns(fill).filter(pl.col("tp") == 1)
    if status is not None:
        runs = runs.filter(pl.col("status") == status)
    if status == "ok":
        runs = runs.filter(pl.col("throughput_rps").is_not_null() & pl.col("throughput_rps").is_finite())
    runs, _ = main_workload(runs)
    return runs.sort("model", "batch_size")


def _ci(row: Mapping[str, Any] | None, end: str) -> float | None:
    value = None if row is None else row.get(f"throughput_rps_ci_{end}")
    return float(value) if value is not None and math.isfinite(value) else None


def uncertain(chosen: Mapping[str, Any], smaller: Sequence[Mapping[str, Any]], plateau: Mapping[str, Any],
              fraction: float) -> bool | None:  # fmt: skip
    """``choice_uncertain`` of the module docstring: a three-valued "or" of its conditions, each null where
    a CI it reads is missing."""
    lo, hi = _ci(plateau, "lo"), _ci(plateau, "hi")
    c_lo = _ci(chosen, "lo")
    # the plateau point itself reaches any fraction <= 1 of its own mean: no "may fall short" there
    itself = chosen.get("batch_size") == plateau.get("batch_size")
    holds = [] if itself else [None if c_lo is None or hi is None else c_lo < fraction * hi]
    holds += [None if h is None or lo is None else h >= fraction * lo for h in (_ci(r, "hi") for r in smaller)]
    if any(holds):
        return True
    return None if None in holds else False


def choose(points: pl.DataFrame, settings: Settings, infeasible: Sequence[int] = (),
           gaps: Mapping[int, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """The plateau and the chosen batch of one model's points (:func:`sweep_points`); ``infeasible``: the
    batch sizes of its sweep that do not fit the KV cache; ``gaps``: its other batch sizes without a
    measured throughput, by status (not measured yet, failed): named in the note, and the choice is
    uncertain (a smaller one might reach the target, a larger one raise the plateau)."""
    gap = [f"b={b} has no measured throughput ({why})" for b, why in sorted((gaps or {}).items())]
    if points.is_empty():
        return {"note": "no measured one-GPU point"}
    plateau = points.sort("throughput_rps", "batch_size", descending=[True, False]).row(0, named=True)
    target = settings.fraction * plateau["throughput_rps"]
    lat = pl.col(settings.latency_column)
    eligible = points if settings.latency_bound_s is None else points.filter(lat <= settings.latency_bound_s)
    out: dict[str, Any] = {
        "plateau_rps": plateau["throughput_rps"], "plateau_batch": plateau["batch_size"],
        "plateau_ci_lo": _ci(plateau, "lo"), "plateau_ci_hi": _ci(plateau, "hi"), "target_rps": target,
        "input_len": plateau["input_len"], "output_len": plateau["output_len"],
    }  # fmt: skip
    edge = []
    if plateau["batch_size"] == points["batch_size"].max():
        larger = [b for b in infeasible if b > plateau["batch_size"]]
        # "the largest that fits" only where the next batch size (sweeps double it) is the one that does not
        if larger and min(larger) == 2 * plateau["batch_size"]:
            edge = [FITS_NOTE.format(batch=min(larger))]
        else:
            edge = [EDGE_NOTE, *([f"b={min(larger)} does not fit the KV cache"] if larger else [])]
    hits = eligible.filter(pl.col("throughput_rps") >= target)
    if hits.is_empty():
        bound = settings.bound_text()
        why = f"no point with {bound}" if eligible.is_empty() else f"no point with {bound} reaches the target"
        return {**out, "note": "; ".join([why, *edge, *gap])}
    row = hits.row(0, named=True)
    smaller = eligible.filter(pl.col("batch_size") < row["batch_size"]).to_dicts()
    return {
        **out, "chosen_batch": row["batch_size"], "chosen_rps": row["throughput_rps"],
        "chosen_ci_lo": _ci(row, "lo"), "chosen_ci_hi": _ci(row, "hi"),
        "chosen_latency_s": row[settings.latency_column],
        "chosen_preemptions": row["preemptions"],
        "choice_uncertain": True if gap else uncertain(row, smaller, plateau, settings.fraction),
        "input_len": row["input_len"], "output_len": row["output_len"], "note": "; ".join([*edge, *gap]) or None,
    }  # fmt: skip


# --- memory ---------------------------------------------------------------------------------------


def gpu_memory_bytes(budget_probe: Mapping[str, Any] | None) -> float | None:
    """``M`` of the module docstring: ``budget_gb x 10^9 / gpu_memory_utilization`` of a budget probe."""
    if not budget_probe or budget_probe.get("status", "ok") != "ok":
        return None
    budget, util = budget_probe.get("budget_gb"), budget_probe.get("gpu_memory_utilization")
    return budget * GB / util if budget and util else None


def share_bytes(whole: Mapping[str, Any], weights: int, kv_bytes: int, gpu_bytes: float | None) -> tuple[float, str]:
    """``S`` of the module docstring and where it comes from."""
    util = whole.get("gpu_memory_utilization")
    if gpu_bytes and util:
        return util * gpu_bytes, f"{util:g} x GPU memory {gpu_bytes / GB:.2f} GB (from the budget probe)"
    return weights + whole["kv_cache_tokens"] * kv_bytes, "weights + KV cache (GPU memory unknown: no budget probe)"


def memory(
    cfg: Mapping[str, Any], whole: Mapping[str, Any] | None, batch: int | None, input_len: int, output_len: int,
    gpu_bytes: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The memory quantities of the module docstring for ``batch`` requests of ``input_len`` + ``output_len``
    tokens; the probe's (``kv_probe_*``, ``kv_whole_gb``, ``freed_*``, ``replicas_fit``) null without one, and
    only those that do not depend on the batch when ``batch`` is None."""
    b, w = capacity.kv_bytes_per_token(cfg), capacity.weight_bytes(cfg)
    out: dict[str, Any] = {"kv_bytes_per_token": b, "weights_gb": w / GB}
    if batch is not None:
        out.update(kv_analytic_gb=batch * (input_len + output_len) * b / GB,
                   kv_analytic_admission_gb=batch * input_len * b / GB)  # fmt: skip
    if not whole or whole.get("status", "ok") != "ok" or not whole.get("kv_cache_tokens"):
        return out
    tokens, block = whole["kv_cache_tokens"], whole.get("block_size")
    share, share_from = share_bytes(whole, w, b, gpu_bytes)
    b_probe = (share - w) / tokens
    out.update(kv_cache_tokens=tokens, block_size=block, share_gb=share / GB, share_from=share_from,
               kv_bytes_per_token_probe=b_probe, kv_whole_gb=(share - w) / GB)  # fmt: skip
    if batch is None:
        return out
    tokens_needed = batch * capacity.blocks_rounded(input_len + output_len, block)
    need = tokens_needed * b_probe
    per_server = share - tokens * b + tokens_needed * b  # F + the batch's KV cache at b bytes per token
    return {
        **out,
        "kv_probe_gb": need / GB,
        "kv_probe_admission_gb": batch * capacity.blocks_rounded(input_len, block) * b_probe / GB,
        "freed_gb": (share - w - need) / GB,
        "freed_frac": 1 - need / (share - w),
        "replicas_fit": math.floor(share / per_server),
    }  # fmt: skip


# --- one row per model ----------------------------------------------------------------------------


def _other_gpu(probes: Sequence[Mapping[str, Any] | None], points: pl.DataFrame) -> str | None:
    """Why a model's probes cannot size its sweep's batch: measured on another GPU model than its points;
    None where they agree or either is unknown (as for :func:`slmserve.capacity.check_probe`, a GPU list NVML
    left empty is not another GPU; nor is a CPU-engine point compared)."""
    found = points["gpu_model"].drop_nulls().to_list() if "gpu_model" in points.columns else []
    sweep = {g for g in found if not g.startswith("CPU")}
    theirs = {analysis.gpu_model(p["provenance"]) for p in probes
              if p and (p.get("provenance") or {}).get("gpu_models")}  # fmt: skip
    if not sweep or not theirs or theirs == sweep:
        return None
    return (f"probes measured on {', '.join(sorted(theirs))}, the sweep on {', '.join(sorted(sweep))}: "
            "memory from the analytic formula only")  # fmt: skip


def advise(
    summary: pl.DataFrame,
    model_configs: Mapping[str, Mapping[str, Any]],
    whole: Mapping[str, Mapping[str, Any]],
    budget: Mapping[str, Mapping[str, Any]] | None = None,
    settings: Settings | None = None,
    models: Sequence[str] = (),
) -> pl.DataFrame:
    """One row per model of ``models`` and of ``summary``: the choice (:func:`choose`) and the memory of
    the chosen batch (:func:`memory`; ``model_configs``: model -> its HF config; ``whole``/``budget``:
    model -> probe; a model's probes of another GPU model than its points are left out, :func:`_other_gpu`).
    A model without a measured point gets a row with its ``note`` only."""
    settings = settings or Settings()
    points, infeasible = sweep_points(summary, settings), sweep_points(summary, settings, "infeasible")
    planned = sweep_points(summary, settings, None)
    rows = []
    for model in dict.fromkeys([*models, *summary["model"].drop_nulls().to_list()]):
        mine = points.filter(pl.col("model") == model)
        too_large = infeasible.filter(pl.col("model") == model)["batch_size"].to_list()
        have = {*too_large, *mine["batch_size"]}
        planned_here = planned.filter(pl.col("model") == model).iter_rows(named=True)
        gaps = {r["batch_size"]: r["status"] if r["status"] != "ok" else "no throughput"
                for r in planned_here if r["batch_size"] not in have}  # fmt: skip
        row: dict[str, Any] = {"model": model, **choose(mine, settings, too_large, gaps)}
        if row.get("plateau_rps") is not None and model in model_configs:
            probes = [whole.get(model), (budget or {}).get(model)]
            other = _other_gpu(probes, mine)
            if other:  # another GPU's memory: the analytic figures only
                probes = [None, None]
                row["note"] = "; ".join(filter(None, [row.get("note"), other]))
            try:
                row.update(memory(model_configs[model], probes[0], row.get("chosen_batch"), row["input_len"],
                                  row["output_len"], gpu_memory_bytes(probes[1])))  # fmt: skip
            except ValueError as exc:  # e.g. a LLaMA sweep: its weights are not counted here (OPT only)
                row["note"] = "; ".join(filter(None, [row.get("note"), f"no memory figures for {model}: {exc}"]))
        rows.append(row)
    settings_cols = {"fraction": settings.fraction, "latency_column": settings.latency_column,
                     "latency_bound_s": settings.latency_bound_s}  # fmt: skip
    return pl.DataFrame([{**r, **settings_cols} for r in rows], schema=SCHEMA)


def advise_model(model: str, runs: Sequence[str | Path], models: Mapping[str, Mapping[str, Any]],
                 whole: Sequence[str | Path], budget: Sequence[str | Path] = (),
                 settings: Settings | None = None) -> pl.DataFrame:  # fmt: skip
    """The advisor's row for ``model`` from its own one-GPU sweep (``runs``: its result files) and probes
    (``whole``, ``budget``: probe JSONs), as :func:`advise` computes it in ``advisor.csv``: one model's row
    depends on that model's points and probes alone."""
    summary = analysis.summarize_runs(list(runs), dict(models))
    probes = capacity.read_probes(whole), capacity.read_probes(budget)
    return advise(summary, model_configs(models, [model]), *probes, settings, [model]).filter(pl.col("model") == model)


def model_configs(models: Mapping[str, Mapping[str, Any]], keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The HF config of each model of ``keys`` that the config's ``models`` names with a config folder."""
    keys = [m for m in dict.fromkeys(keys) if models.get(m, {}).get("config")]
    return {m: capacity.load_config(models[m]["config"]) for m in keys}


# --- text -----------------------------------------------------------------------------------------


def _num(value: float | None, fmt: str = ".1f") -> str:
    return _MISSING if value is None or not math.isfinite(value) else format(value, fmt)


def _with_ci(value: float | None, lo: float | None, hi: float | None) -> str:
    ci = f" [{_num(lo)}, {_num(hi)}]" if lo is not None and hi is not None else " (no CI: n = 1)"
    return _num(value) + ("" if value is None else ci)


def _text_row(r: Mapping[str, Any], name: str) -> dict[str, str]:
    chosen = r.get("chosen_batch")
    uncertain_text = {True: "yes", False: "no", None: "unknown (no CI)"}[r.get("choice_uncertain")]
    plateau = _with_ci(r.get("plateau_rps"), r.get("plateau_ci_lo"), r.get("plateau_ci_hi"))
    return {
        "Model": name,
        "Plateau req/s [95% CI] (batch)": plateau + (f" (b={r['plateau_batch']})" if r.get("plateau_batch") else ""),
        "Fraction": _num(r.get("fraction"), ".2f"),
        "Latency bound": _MISSING if r.get("latency_bound_s") is None else f"{r['latency_column']} <= "
        f"{r['latency_bound_s']:g} s",
        "Chosen batch": str(chosen) if chosen is not None else "none",
        "Chosen req/s [95% CI]": _with_ci(r.get("chosen_rps"), r.get("chosen_ci_lo"), r.get("chosen_ci_hi")),
        "Uncertain": uncertain_text if chosen is not None else _MISSING,
        f"{r.get('latency_column')} (s)": _num(r.get("chosen_latency_s"), ".2f"),
        "KV analytic GB (prompt+output / prompt)": f"{_num(r.get('kv_analytic_gb'), '.2f')} / "
        f"{_num(r.get('kv_analytic_admission_gb'), '.2f')}",
        "KV probe GB (prompt+output / prompt)": f"{_num(r.get('kv_probe_gb'), '.2f')} / "
        f"{_num(r.get('kv_probe_admission_gb'), '.2f')}",
        "Whole-GPU KV GB": _num(r.get("kv_whole_gb"), ".2f"),
        "Freed GB (%)": _MISSING if r.get("freed_gb") is None
        else f"{r['freed_gb']:.2f} ({100 * r['freed_frac']:.0f}%)",
        "Replicas fit": _num(r.get("replicas_fit"), ".0f") if r.get("replicas_fit") is not None else _MISSING,
        "Note": r.get("note") or "",
    }  # fmt: skip


def table(df: pl.DataFrame) -> pl.DataFrame:
    """The advice as strings, one row per model, ordered by model size."""
    names = model_names(df)
    order = sorted(df.iter_rows(named=True), key=lambda r: (names.get(r["model"], ("", math.inf))[1], r["model"]))
    return pl.DataFrame([_text_row(r, names.get(r["model"], (r["model"],))[0]) for r in order])


def to_csv(df: pl.DataFrame) -> str:
    """Every numeric column of :func:`advise` (the quantities of the module docstring), by model size."""
    names = model_names(df)
    size = {k: v[1] for k, v in names.items()}
    out = df.with_columns(_size=pl.col("model").replace_strict(size, default=math.inf, return_dtype=pl.Float64))
    return out.sort("_size", "model").drop("_size").write_csv(float_precision=6)


NOTE = (
    "Plateau = the largest mean throughput over the model's one-GPU, all-at-once points; chosen batch = the "
    "smallest batch reaching the fraction of it (within the latency bound, if any). KV need of the chosen batch: "
    "analytic = batch x tokens x 2 x 2 x hidden x layers bytes; probe = batch x tokens in whole KV blocks x "
    "bytes per token of the whole-GPU probe ((memory share - weights) / KV-cache tokens); tokens = prompt + "
    "output (no preemption) / prompt (vLLM's admission rule). Freed = whole-GPU KV cache - probe need (prompt + "
    "output); replicas fit = floor(memory share / (what one server holds besides its KV cache + the batch's whole "
    "requests in KV blocks at the analytic bytes per token)), each server holding what the probe's server held "
    "besides its KV cache (memory share - KV-cache tokens x analytic bytes per token). Uncertain: the 95% CIs of "
    "the chosen point, the smaller batches or the plateau straddle the target (slmserve.advisor). GB = 10^9 bytes."
)


def to_markdown(df: pl.DataFrame) -> str:
    """The advice as a Markdown table and a note: the definitions, the memory share's source per model."""
    text = table(df)
    head = "| " + " | ".join(text.columns) + " |"
    align = "|:---|" + "---:|" * (text.width - 2) + ":---|"  # the note left-aligned
    body = ["| " + " | ".join(row) + " |" for row in text.iter_rows()]
    names = model_names(df)
    shares = "; ".join(
        f"{names[r['model']][0]}: {r['share_gb']:.2f} GB = {r['share_from']}"
        for r in df.iter_rows(named=True)
        if r.get("share_gb") is not None
    )
    notes = [NOTE] + ([f"Memory share: {shares}."] if shares else [])
    return "\n".join([head, align, *body, "", *notes]) + "\n"


# --- figure ---------------------------------------------------------------------------------------


def _curve(points: pl.DataFrame, advice: pl.DataFrame, model_configs: Mapping[str, Mapping[str, Any]],
           whole: Mapping[str, Mapping[str, Any]], gpu: Mapping[str, float | None]) -> pl.DataFrame:  # fmt: skip
    """Per plotted point: throughput with CI, the probe's KV need at its batch (analytic without a probe),
    and whether it is the chosen one."""
    chosen = dict(zip(advice["model"], advice["chosen_batch"], strict=True)) if "chosen_batch" in advice.columns else {}
    # the probes advise kept (it leaves out another GPU's: _other_gpu); the others get the analytic need
    kept = set(advice.filter(pl.col("share_gb").is_not_null())["model"]) if "share_gb" in advice.columns else set()
    rows = []
    for r in points.iter_rows(named=True):
        m = r["model"]
        probe, share = (whole.get(m), gpu.get(m)) if m in kept else (None, None)
        try:
            mem = memory(model_configs[m], probe, r["batch_size"], r["input_len"], r["output_len"], share) \
                if m in model_configs else {}  # fmt: skip
        except ValueError:  # weights not counted for this family (advise's note says so): no KV need drawn
            mem = {}
        rows.append({
            "model": m, "batch_size": r["batch_size"], "throughput_rps": r["throughput_rps"],
            "lo": _ci(r, "lo"), "hi": _ci(r, "hi"), "kv_gb": mem.get("kv_probe_gb", mem.get("kv_analytic_gb")),
            "chosen": chosen.get(m) == r["batch_size"],
        })  # fmt: skip
    schema = {"model": pl.String, "batch_size": pl.Int64, "throughput_rps": pl.Float64, "lo": pl.Float64,
              "hi": pl.Float64, "kv_gb": pl.Float64, "chosen": pl.Boolean}  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


def _panel(
    data: pl.DataFrame, y: str, title: str, order: Sequence[str], ticks: list[int], reference: alt.Chart
) -> alt.LayerChart:
    """One panel: ``y`` against batch size (log2), a line per model, the chosen batch marked, the 95% CI on
    throughput, and ``reference`` (a dashed rule per model) on top."""
    x = alt.X("batch_size:Q", title="Batch size", scale=alt.Scale(type="log", base=2),
              axis=alt.Axis(values=ticks, format="d"))  # fmt: skip
    base = alt.Chart(data).encode(x=x, y=alt.Y(f"{y}:Q", title=title), color=color_scale(order))
    lines = base.mark_line().encode(order="batch_size:Q")
    tips = ["model:N", "batch_size:Q", "throughput_rps:Q", "lo:Q", "hi:Q", "kv_gb:Q", "chosen:N"]
    points = base.mark_point(filled=True, size=35).encode(tooltip=tips)
    chosen = base.mark_point(shape="diamond", filled=False, size=260, strokeWidth=2.5).transform_filter(
        "datum.chosen === true"
    )
    layers = [lines, points, chosen, reference]
    if y == "throughput_rps":
        errors = base.mark_rule(strokeWidth=1.5).encode(y=alt.Y("lo:Q", title=title), y2="hi:Q")
        layers.append(errors.transform_filter("isValid(datum.lo)"))
    if data.is_empty():
        layers.append(no_data())
    return alt.layer(*layers)


def figure(
    summary: pl.DataFrame, advice: pl.DataFrame, model_configs: Mapping[str, Mapping[str, Any]],
    whole: Mapping[str, Mapping[str, Any]], budget: Mapping[str, Mapping[str, Any]] | None = None,
    settings: Settings | None = None,
) -> tuple[alt.TopLevelMixin, str]:  # fmt: skip
    """Throughput (with 95% CI) and the KV memory each batch needs (probe, prompt + output) against batch
    size per model, one GPU; the chosen batch circled by a diamond, the target (fraction x plateau) and the
    whole-GPU KV cache as dashed rules."""
    settings = settings or Settings()
    points = sweep_points(summary, settings)
    gpu = {m: gpu_memory_bytes(p) for m, p in (budget or {}).items()}
    data = _curve(points, advice, model_configs, whole, gpu)
    data, order = named(data)
    names = {k: v[0] for k, v in model_names(advice).items()}
    ticks = sorted(set(data["batch_size"].to_list()))
    refs = advice.select(pl.col("model").replace(names), "target_rps", "kv_whole_gb")
    rule = alt.Chart(refs).mark_rule(strokeDash=[5, 4], opacity=0.7).encode(color=color_scale(order))
    target = rule.encode(y="target_rps:Q").transform_filter("isValid(datum.target_rps)")
    kv_whole = rule.encode(y="kv_whole_gb:Q").transform_filter("isValid(datum.kv_whole_gb)")
    left = _panel(data, "throughput_rps", "Throughput (requests/s)", order, ticks, target)
    right = _panel(data, "kv_gb", "KV memory the batch needs (GB)", order, ticks, kv_whole)
    title = f"Batching advisor: smallest batch reaching {settings.fraction:.0%} of the throughput plateau"
    left, right = (
        left.properties(title="Throughput (dashed: target)"),
        right.properties(title="KV memory (dashed: whole-GPU KV cache)"),
    )
    chart = alt.hconcat(left, right).properties(title=title)
    return chart, caption(summary.filter(pl.col("tp") == 1), title, _notes(advice, settings, names))


def _notes(advice: pl.DataFrame, settings: Settings, names: Mapping[str, str]) -> list[str]:
    lines = [f"Fraction {settings.fraction:g}; latency bound: {settings.bound_text()}. {NOTE}"]
    for r in advice.iter_rows(named=True):
        name = names.get(r["model"], display_name(r["model"]))
        if r.get("chosen_batch") is None:
            lines.append(f"{name}: no batch chosen ({r.get('note')}).")
            continue
        lines.append(
            f"{name}: batch {r['chosen_batch']} at {_with_ci(r['chosen_rps'], r['chosen_ci_lo'], r['chosen_ci_hi'])}"
            f" req/s of the plateau {_with_ci(r['plateau_rps'], r['plateau_ci_lo'], r['plateau_ci_hi'])} req/s "
            f"(batch {r['plateau_batch']}); KV need {_num(r.get('kv_probe_gb'), '.2f')} GB of "
            f"{_num(r.get('kv_whole_gb'), '.2f')} GB; replicas that fit: {_num(r.get('replicas_fit'), '.0f')}"
            + (f"; {r['note']}." if r.get("note") else ".")
        )
    return lines
