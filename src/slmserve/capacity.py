"""KV-cache capacity and the largest batch that fits (the paper's Table 1).

The paper sizes a token's KV cache as ``2 (fp16) * 2 (key and value) * hidden * layers`` bytes (section
2.1) and reports, for a 36 GB budget (90% of a 40 GB A100), the largest power-of-two batch up to 512.
Its values (512/256/128/64/16 for OPT-125M to 13B) follow when a batch *fits* as vLLM admits it: every
request's prompt (``input_len`` tokens) must be resident in the KV cache, next to the fp16 weights.
Output tokens are allocated on demand as they are generated; when they run out vLLM preempts, which the
runs record (``vllm:num_preemptions_total``). The stricter rule -- whole requests, prompt plus every
output token, resident at once -- is reported beside it. The table itself is :mod:`slmserve.table1`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from slmserve import provenance

# The paper's Table 1: maximum batch size on a 40 GB A100 (36 GB for vLLM), capped at 512.
PAPER_TABLE1: dict[str, int] = {"opt125m": 512, "opt1.3b": 256, "opt2.7b": 128, "opt6.7b": 64, "opt13b": 16}
PAPER_WEIGHTS_GB: dict[str, float] = {"opt125m": 0.25, "opt1.3b": 2.6, "opt2.7b": 5.4, "opt6.7b": 13.4, "opt13b": 26.0}
BATCH_CAP = 512
FP16 = 2


class ProbeMismatch(RuntimeError):
    """A KV-cache probe was measured on another GPU model or engine than the job that would size itself by it."""


# what every probe holds, and what a measured one (status ok) holds besides
PROBE_KEYS = ("model", "status")
MEASURED_KEYS = ("kv_cache_tokens", "max_batch_admission", "max_batch_no_preemption")


def read_probe(path: str | Path) -> dict[str, Any]:
    """A KV-cache probe (the JSON of :func:`slmserve.runner.probe_capacity`) with ``source``, its file; one
    that is not valid JSON or lacks a key of :data:`PROBE_KEYS` (and, measured, of :data:`MEASURED_KEYS`)
    raises ValueError naming the file."""
    redo = f"delete it and rerun `snakemake {path}` (with this profile's --configfile)"
    try:
        probe = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a KV-cache probe's JSON ({exc}); {redo}") from None
    if not isinstance(probe, dict):
        raise ValueError(f"{path}: not a KV-cache probe's JSON (a {type(probe).__name__}); {redo}")
    keys = PROBE_KEYS + (MEASURED_KEYS if probe.get("status") == "ok" else ())
    missing = [k for k in keys if k not in probe]
    if missing:
        raise ValueError(f"{path}: the KV-cache probe has no {', '.join(missing)}; {redo}")
    return {**probe, "source": str(path)}


def read_probes(paths: Iterable[str | Path]) -> dict[str, dict[str, Any]]:
    """The probes of ``paths`` (:func:`read_probe`) by model."""
    probes = [read_probe(p) for p in paths]
    return {p["model"]: p for p in probes}


def check_probe(probe: Mapping[str, Any] | None, here: Mapping[str, Any]) -> None:
    """Raise :class:`ProbeMismatch` if ``probe`` ran on another GPU model or engine than ``here`` (the job's
    :func:`slmserve.provenance.kind`): its KV-cache size, and the batch and replica memory a job takes from
    it, are another machine's (an H100's 118,976 tokens of OPT-6.7B against an H200's 230,720). No probe:
    nothing to check."""
    probe = probe or {}
    said = provenance.kind_differences(probe.get("provenance") or {}, here)
    if said:
        source = probe.get("source", "the KV-cache probe")
        raise ProbeMismatch(
            f"{source}: measured on another kind of machine than this job's ({said}), so the batch and memory "
            "it gives are that machine's. Measure this GPU into an outdir of its own (a profile with its own "
            f"`outdir`), or probe it again: `snakemake {source} --force --configfile <this profile's config>` "
            "replaces the file for everything that reads it, Table 1 too"
        )


def load_config(folder: str | Path) -> dict[str, Any]:
    return json.loads((Path(folder) / "config.json").read_text())


def _dims(cfg: Mapping[str, Any]) -> tuple[int, int]:
    """(hidden size, layers) across the config spellings of OPT/LLaMA, GPT-J and MPT."""
    hidden = cfg.get("hidden_size") or cfg.get("n_embd") or cfg.get("d_model")
    layers = cfg.get("num_hidden_layers") or cfg.get("n_layer") or cfg.get("n_layers")
    if not hidden or not layers:
        raise ValueError("model config has no hidden size / layer count (hidden_size, n_embd, d_model)")
    return int(hidden), int(layers)


def kv_bytes_per_token(cfg: Mapping[str, Any], dtype_bytes: int = FP16) -> int:
    """Paper, section 2.1: 2 (fp16) x 2 (key, value) x hidden x layers."""
    hidden, layers = _dims(cfg)
    return dtype_bytes * 2 * hidden * layers


def param_count(cfg: Mapping[str, Any]) -> int:
    """Parameters of an OPT model from its config (decoder layers, embeddings, learned positions)."""
    if cfg.get("model_type") != "opt":
        raise ValueError(f"param_count knows OPT only, not {cfg.get('model_type')!r}")
    h, f, n = cfg["hidden_size"], cfg["ffn_dim"], cfg["num_hidden_layers"]
    per_layer = 4 * h * h + 4 * h + 2 * h * f + h + f + 4 * h  # attention, MLP, two layer norms
    proj = cfg["word_embed_proj_dim"]
    embed = cfg["vocab_size"] * proj + (cfg["max_position_embeddings"] + 2) * h
    extra = 2 * h * proj if proj != h else 0  # project_in/out (OPT-350m)
    return n * per_layer + embed + extra + 2 * h


def weight_bytes(cfg: Mapping[str, Any], dtype_bytes: int = FP16) -> int:
    return param_count(cfg) * dtype_bytes


def max_batch(capacity_tokens: int, tokens_per_seq: int, cap: int = BATCH_CAP) -> int:
    """Largest power of two <= ``cap`` whose sequences fit ``capacity_tokens``; 0 if not even one."""
    fits = capacity_tokens // tokens_per_seq if tokens_per_seq > 0 else 0
    batch = 0
    b = 1
    while b <= min(cap, fits):
        batch = b
        b *= 2
    return batch


def analytic_capacity_tokens(cfg: Mapping[str, Any], budget_gb: float) -> int:
    """KV-cache tokens left in ``budget_gb`` (10^9 bytes) after the fp16 weights."""
    free = budget_gb * 1e9 - weight_bytes(cfg)
    return max(0, int(free // kv_bytes_per_token(cfg)))


def analytic_max_batch(cfg: Mapping[str, Any], budget_gb: float, input_len: int, output_len: int) -> dict[str, int]:
    """Largest batch by the admission rule (prompts resident) and by whole requests (no preemption)."""
    tokens = analytic_capacity_tokens(cfg, budget_gb)
    return {
        "capacity_tokens": tokens,
        "admission": max_batch(tokens, input_len),
        "no_preemption": max_batch(tokens, input_len + output_len),
    }


def blocks_rounded(tokens: int, block_size: int | None) -> int:
    """Tokens a sequence occupies in whole KV-cache blocks."""
    if not block_size:
        return tokens
    return -(-tokens // block_size) * block_size
