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


@pytest.mark.parametrize(
    ("mutate", "pattern"),
    [
        # a repeat would be measured twice and counted as twice the repeats (a CI too narrow)
        (lambda c: c["experiments"]["sweep"].__setitem__("batch_sizes", [4, 4, 8]),
         r"experiments\.sweep\.batch_sizes: .*non-unique.*list each value once"),
        (lambda c: c["experiments"]["sweep"].__setitem__("models", ["opt125m", "opt125m"]),
         r"experiments\.sweep\.models: .*list each value once"),
        (lambda c: c["calibration"].__setitem__("models", ["opt1.3b", "opt1.3b"]), r"calibration\.models: .*once"),
        # a model's name becomes a folder of the results' paths
        (lambda c: c["models"].__setitem__("opt/125m", {"config": "config/models/opt-125m"}),
         r"config key models: 'opt/125m' does not match .*it becomes a folder name"),
        # the rate takes a number or "inf": the message says so, not only "not one of ['inf']"
        (lambda c: c["workload"].__setitem__("arrival_rate", "1e3"),
         r"workload\.arrival_rate: '1e3' is not allowed: Arrival rate in requests/s, or \"inf\""),
        (lambda c: c["workload"].__setitem__("output_len", "64"),
         r"workload\.output_len: '64' is not of type 'integer'; a nested key given with --config .* --configfile"),
        (lambda c: c["workload"].__setitem__("arrival_rate", "10"), r"'10' is not allowed: .*arrives as a string"),
        (lambda c: c.__setitem__("replot", "yes"), r"replot: 'yes' is not of type 'boolean' \(schema"),  # top level
    ],
)  # fmt: skip
def test_schema_errors_say_what_the_key_takes(mutate, pattern: str) -> None:
    cfg = _paper()
    mutate(cfg)
    with pytest.raises(config.ConfigError, match=pattern):
        config.check_schema(cfg, SCHEMA)


def test_a_broken_model_config_json_stops_the_plan(tmp_path: Path) -> None:
    """Read first by Table 1 and the advisor, after the GPU probes: a file that is not JSON stops the plan."""
    folder = tmp_path / "opt-125m"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "opt", ')
    cfg = _paper()
    cfg["models"]["opt125m"]["config"] = str(folder)
    with pytest.raises(config.ConfigError, match=r"models\.opt125m\.config: .*config\.json is not valid JSON"):
        config.check(cfg, ROOT)


def test_damaged_results_and_probes_are_named_with_what_to_do(tmp_path: Path) -> None:
    from slmserve import analysis, capacity, io

    empty, cut = tmp_path / "bs1.requests.parquet", tmp_path / "bs2.requests.parquet"
    empty.write_bytes(b"")
    cut.write_bytes(b"PAR1" + b"\0" * 20)
    for path in (empty, cut):
        with pytest.raises(ValueError, match=rf"{path}: not a readable parquet file .*delete it and rerun"):
            analysis.summarize_runs([str(path)], {})
        with pytest.raises(ValueError, match=rf"{path}: not a readable parquet file"):
            io.read_table(path)
    with pytest.raises(FileNotFoundError, match=r"nowhere\.parquet: no such file; rerun the rule"):
        io.read_meta(tmp_path / "nowhere.parquet")
    (tmp_path / "folder.parquet").mkdir()  # unreadable but not damaged (as a permission error): never "delete it"
    with pytest.raises(OSError, match=r"folder\.parquet: cannot be read .*check its permissions") as info:
        io.read_meta(tmp_path / "folder.parquet")
    assert "delete" not in str(info.value)
    probe = tmp_path / "opt125m-whole.json"
    for text, why in (('{"model": "opt125m", ', "not a KV-cache probe's JSON"),
                      ("[1, 2]", "not a KV-cache probe's JSON"), ('{"status": "ok"}', "has no model"),
                      ('{"model": "opt125m", "status": "ok", "kv_cache_tokens": 5}',
                       "has no max_batch_admission, max_batch_no_preemption")):  # fmt: skip
        probe.write_text(text)
        with pytest.raises(ValueError, match=rf"{probe}: .*{why}.*delete it and rerun `snakemake {probe}`"):
            capacity.read_probes([probe])
    probe.write_text('{"model": "opt125m", "status": "infeasible", "reason": "no memory"}')
    assert capacity.read_probe(probe)["status"] == "infeasible"  # nothing measured: no capacity keys needed


def test_targets_outside_the_configs_lengths_and_counts_are_refused(tmp_path: Path) -> None:
    """A target names its own output length or replica count, which the config's checks never saw."""
    out = tmp_path / "r"
    long = out / "runs/opt125m/tp1-out999-rateinf/bs4.requests.parquet"
    proc = snakemake(str(long), "-n", "--cores", "1", "--config", f"outdir={out}", "allow_cpu=True")
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "output length 999: input_len + output_len = 1511 tokens exceed engine.max_model_len 1024" in text
    # 0 replicas, TP=3, and a second spelling of rate 10 (its point would be measured again in another folder)
    for target in (
        "replication/opt125m_r0.parquet",
        "runs/opt125m/tp3-out256-rateinf/bs4.requests.parquet",
        "runs/opt125m/tp1-out256-rate10.0/bs4.requests.parquet",
    ):
        proc = snakemake(str(out / target), "-n", "--cores", "1", "--config", f"outdir={out}", "allow_cpu=True")
        assert proc.returncode != 0 and "Job stats" not in proc.stdout, target
        assert "MissingRuleException" in proc.stdout + proc.stderr, target
    # a numeric rate, in the config or a target's path, is a rate (it was refused as a string)
    rate = out / "runs/opt125m/tp1-out256-rate10/bs4.requests.parquet"
    proc = snakemake(str(rate), "-n", "--cores", "1", "--config", f"outdir={out}", "allow_cpu=True")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]
