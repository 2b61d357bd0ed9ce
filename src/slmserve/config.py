"""Checks of the workflow configuration beyond its JSON schema, and the naming of runs.

The schema (``config/schemas/config.schema.yaml``, applied by Snakemake's ``validate``) checks types,
ranges and enumerations and fills defaults; :func:`check` adds what a schema cannot say: that every
model an experiment names is defined, that its config folder exists, and that the context window holds
the workload.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key, the value and what is allowed."""


def parse_rate(value: float | int | str) -> float:
    """An arrival rate from the config or a path's ``rate`` wildcard: a positive number (also as a string,
    ``"10"``) or ``"inf"``."""
    try:
        rate = float(value)  # "inf" and "infinity" too, in any case
    except (TypeError, ValueError):
        rate = math.nan
    if not rate > 0:  # also NaN
        raise ConfigError(f"arrival rate {value!r}: allowed values are a positive number or 'inf'")
    return rate


def number_label(value: float) -> str:
    """A number as file names spell it: plain digits without a trailing ``.0`` (``10``, ``0.5``), never an
    exponent; the one spelling the paths' wildcards accept, so that one value has one file."""
    return format(Decimal(repr(float(value))).normalize(), "f")


def rate_label(rate: float) -> str:
    """How a rate appears in file names: ``inf`` or :func:`number_label`."""
    return "inf" if math.isinf(rate) else number_label(rate)


def check_schema(config: Mapping[str, Any], schema_path: str | Path) -> None:
    """Raise :class:`ConfigError` naming the first key that violates the schema, the offending value and
    what is allowed, in a few lines (Snakemake's ``validate`` would print the whole schema)."""
    import jsonschema
    import yaml

    schema = yaml.safe_load(Path(schema_path).read_text())
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(dict(config)))
    if error is None:
        return
    key = ".".join(str(p) for p in error.absolute_path) or "(top level)"
    message, allowed = error.message, ""
    branches = error.parent is not None and error.parent.validator in ("oneOf", "anyOf")
    if branches:  # one branch's complaint ("not one of ['inf']") hides the others: say what the key takes
        message = f"{error.instance!r} is not allowed: {error.parent.schema.get('description', 'see the schema')}"
    elif error.validator == "additionalProperties":
        allowed = f"; allowed keys here: {', '.join(sorted(error.schema.get('properties', {})))}"
    elif error.validator == "enum":
        allowed = f"; allowed values: {', '.join(map(str, error.validator_value))}"
    elif error.validator == "uniqueItems":
        allowed = "; list each value once (a repeat would be measured and counted twice)"
    elif "propertyNames" in error.schema_path:
        allowed = "; a name is letters, digits, '.', '_' and '-' (it becomes a folder name)"
    if (error.validator == "type" or branches) and isinstance(error.instance, str) and len(error.absolute_path) > 1:
        allowed += "; a nested key given with --config arrives as a string: set it in a --configfile"
    raise ConfigError(f"config key {key}: {message}{allowed} (schema: {schema_path})")


def _model_names(config: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """Every ``(key, model name)`` the config refers to outside ``models``."""
    from slmserve.layout import EXPERIMENTS

    exps = config.get("experiments", {})
    for exp in (*(e for e in EXPERIMENTS if e != "output_lengths"), "table1"):
        for i, name in enumerate(exps.get(exp, {}).get("models", [])):
            yield f"experiments.{exp}.models[{i}]", name
    out = exps.get("output_lengths", {})
    if out.get("output_lens") and out.get("arrival_rates"):
        yield "experiments.output_lengths.model", out.get("model", "")
    for i, name in enumerate((config.get("calibration") or {}).get("models", [])):
        yield f"calibration.models[{i}]", name


def model_workload(config: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The workload of ``model``'s jobs: ``workload`` with the keys its ``models.<model>.workload`` sets."""
    return {**config["workload"], **(config["models"][model].get("workload") or {})}


def check(config: Mapping[str, Any], root: Path | None = None) -> None:
    """Raise :class:`ConfigError` for what the schema cannot check. ``root`` resolves relative paths."""
    from slmserve.capacity import load_config
    from slmserve.server import own_flags

    root = root or Path.cwd()
    models = config.get("models", {})
    for key, name in _model_names(config):
        if name not in models:
            allowed = ", ".join(sorted(models)) or "(none defined)"
            raise ConfigError(f"config key {key}: unknown model {name!r}; allowed values: {allowed}")
    for name, entry in models.items():
        if own := own_flags(entry.get("engine_args") or []):
            raise ConfigError(
                f"config key models.{name}.engine_args: {' '.join(own)} is set by slmserve for every server "
                "(loopback host, a reserved port, the batch and memory settings of the experiment); remove it"
            )
        if entry.get("weights"):
            continue
        cfg_dir = root / entry["config"]
        if not (cfg_dir / "config.json").is_file():
            raise ConfigError(
                f"config key models.{name}.config: {cfg_dir}/config.json does not exist; point it at a "
                f"folder holding the model's config.json, or set models.{name}.weights"
            )
        try:  # read after the GPU jobs (Table 1, the advisor): a broken file must stop the plan, not them
            load_config(cfg_dir)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"config key models.{name}.config: {cfg_dir}/config.json is not valid JSON ({exc}); restore "
                "the model's published config.json"
            ) from None
    wl, eng = config.get("workload", {}), config.get("engine", {})
    need = wl.get("input_len", 512) + max(
        [
            wl.get("output_len", 256),
            *config.get("experiments", {}).get("output_lengths", {}).get("output_lens", []),
        ]
    )
    if eng.get("max_model_len", 1024) < need:
        raise ConfigError(
            f"config key engine.max_model_len: {eng.get('max_model_len')} cannot hold input_len + output_len "
            f"= {need} tokens; set it to at least {need}"
        )
    for i, rate in enumerate(config.get("experiments", {}).get("output_lengths", {}).get("arrival_rates", [])):
        try:
            parse_rate(rate)
        except ConfigError as exc:
            raise ConfigError(f"config key experiments.output_lengths.arrival_rates[{i}]: {exc}") from None
    parse_rate(wl.get("arrival_rate", "inf"))
