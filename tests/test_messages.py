"""Messages a new user meets: configuration errors name the key, the value and what is allowed in a few
lines; a truncated dataset is reported on the console, not only in a job log."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slmserve import config
from tests.conftest import ROOT, snakemake

SCHEMA = ROOT / "config/schemas/config.schema.yaml"


def _paper() -> dict:
    return yaml.safe_load((ROOT / "config/config.yaml").read_text())


def test_a_misspelled_top_level_key_is_named_in_a_few_lines(tmp_path: Path) -> None:
    bad = tmp_path / "typo.yaml"
    bad.write_text("experimentz: {}\n")
    proc = snakemake("all", "-n", "--cores", "1", "--configfile", "config/smoke.yaml", str(bad))
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "'experimentz' was unexpected" in text and "allowed keys here: allow_cpu, calibration, dataset" in text
    assert len(text.splitlines()) < 40, text[-3000:]  # not the whole schema


def test_a_wrong_enum_value_lists_the_allowed_ones() -> None:
    cfg = _paper()
    cfg["engine"]["batch_control"] = "servr"
    with pytest.raises(config.ConfigError, match=r"engine.batch_control: 'servr' .*allowed values: restart, scheduler"):
        config.check_schema(cfg, SCHEMA)
    config.check_schema(_paper(), SCHEMA)  # the shipped configuration passes


def test_a_missing_model_folder_names_the_key_to_set(tmp_path: Path) -> None:
    cfg = _paper()
    cfg["models"]["opt125m"]["config"] = "nowhere/opt-125m"
    with pytest.raises(config.ConfigError, match=r"or set models\.opt125m\.weights"):
        config.check(cfg, ROOT)


def test_a_truncated_dataset_is_reported_on_the_console(tmp_path: Path) -> None:
    out = tmp_path / "results"
    target = out / "data/prompts-in128-n16.parquet"
    proc = snakemake(str(target), "--cores", "1", "--configfile", "config/smoke.yaml", "--config", f"outdir={out}",
                     timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "prepare_dataset: " in proc.stderr and "truncated" in proc.stderr


def test_an_experiment_without_models_names_the_figures_left_out(tmp_path: Path) -> None:
    overlay = tmp_path / "nosweep.yaml"
    overlay.write_text("experiments:\n  sweep:\n    models: []\n")
    proc = snakemake("all", "-n", "--cores", "1", "--configfile", "config/config.yaml", str(overlay),
                     "--config", f"outdir={tmp_path}/r", f"figdir={tmp_path}/f", "allow_cpu=True")  # fmt: skip
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-2000:]
    assert "experiments.sweep plans no run, so `all` builds none of its figures: throughput_latency" in text
