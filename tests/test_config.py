"""Configuration: the schema (through Snakemake's validate), the checks beyond it, and the DAG."""

from __future__ import annotations

import copy
import math
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml
from snakemake.utils import update_config, validate

from slmserve.config import ConfigError, check, model_workload, parse_rate, rate_label
from slmserve.layout import EXPERIMENTS, FIGURES
from slmserve.server import ServerSpec
from tests.conftest import ROOT, snakemake

SCHEMA = str(ROOT / "config/schemas/config.schema.yaml")


@pytest.fixture
def cfg() -> dict:
    return yaml.safe_load((ROOT / "config/config.yaml").read_text())


def test_paper_config_validates_and_fills_defaults(cfg: dict) -> None:
    del cfg["telemetry"]
    validate(cfg, SCHEMA)
    check(cfg, ROOT)
    assert cfg["telemetry"] == {"interval_ms": 100, "enabled": True}
    assert cfg["workload"] == {
        "num_requests": 500, "input_len": 512, "output_len": 256, "arrival_rate": "inf", "warmup_requests": 8,
        "rounds_per_batch": None, "min_requests": 64, "repeats": 3, "repeat_budget_s": 600,
    }  # fmt: skip
    assert cfg["experiments"]["sweep"]["batch_sizes"] == [2**i for i in range(10)]
    assert cfg["experiments"]["replication"]["replicas"] == [1, 2, 3]


def test_every_schema_key_has_description_and_default() -> None:
    schema = yaml.safe_load(Path(SCHEMA).read_text())
    missing = []

    def walk(node: dict, path: str) -> None:
        for key, sub in node.get("properties", {}).items():
            if "description" not in sub:
                missing.append(f"{path}{key}: description")
            if "default" not in sub and key not in node.get("required", []):
                missing.append(f"{path}{key}: default")
            walk(sub, f"{path}{key}.")

    walk(schema, "")
    assert missing == []


@pytest.mark.parametrize(
    ("mutate", "pattern"),
    [
        (
            lambda c: c["experiments"]["sweep"]["batch_sizes"].__setitem__(2, -4),
            r"-4 is less than the minimum of 1",
        ),
        (
            lambda c: c["experiments"]["sweep"]["batch_sizes"].__setitem__(0, 1.5),
            r"1\.5 is not of type 'integer'",
        ),
        (
            lambda c: c["experiments"]["sweep"]["batch_sizes"].__setitem__(0, "8"),
            r"'8' is not of type 'integer'",
        ),
        (
            lambda c: c["engine"].__setitem__("batch_control", "both"),
            r"'both' is not one of \['restart', 'scheduler', 'client', 'server'\]",
        ),
        (lambda c: c["workload"].__setitem__("input_len", 0), r"0 is less than the minimum of 1"),
        (lambda c: c.__setitem__("bogus", 1), r"Additional properties are not allowed \('bogus'"),
        (lambda c: c.__setitem__("profile", "my run/1"), r"'my run/1' does not match"),  # a path-safe name
        (
            lambda c: c["models"]["opt13b"].__setitem__("workload", {"rounds": 8}),
            r"Additional properties are not allowed \('rounds'",
        ),
        (lambda c: c["models"]["opt13b"].__setitem__("workload", {"min_requests": 0}), r"0 is less than the minimum"),
    ],
)
def test_schema_violations_name_key_and_allowed(cfg: dict, mutate, pattern: str) -> None:
    mutate(cfg)
    with pytest.raises(Exception, match=pattern) as info:
        validate(cfg, SCHEMA)
    assert "On instance" in str(info.value)  # names where in the config


def test_a_config_of_ones_own_names_its_own_profile(cfg: dict) -> None:
    cfg["profile"] = "a100-80gb-lab"
    validate(cfg, SCHEMA)
    check(cfg, ROOT)


def test_unknown_model_names_key_and_allowed_values(cfg: dict) -> None:
    cfg["experiments"]["sweep"]["models"].append("opt175b")
    validate(cfg, SCHEMA)
    with pytest.raises(ConfigError, match=r"experiments\.sweep\.models\[6\]: unknown model 'opt175b'") as info:
        check(cfg, ROOT)
    assert "opt125m" in str(info.value) and "gptj6b" in str(info.value)
    cfg["experiments"]["sweep"]["models"].pop()
    cfg["calibration"]["models"] = ["opt125m", "opt999"]
    with pytest.raises(ConfigError, match=r"calibration\.models\[1\]: unknown model 'opt999'"):
        check(cfg, ROOT)


def test_missing_model_config_folder(cfg: dict, tmp_path: Path) -> None:
    cfg["models"]["opt125m"]["config"] = "nowhere/opt"
    with pytest.raises(ConfigError, match=r"models\.opt125m\.config: .*nowhere/opt/config\.json does not exist"):
        check(cfg, ROOT)
    cfg["models"]["opt125m"]["weights"] = "facebook/opt-125m"
    check(cfg, ROOT)  # real weights named: no config folder needed


def test_engine_args_may_not_set_what_every_server_gets_from_slmserve(cfg: dict) -> None:
    """vLLM's parser takes the last value given: `--host 0.0.0.0` in a model's engine_args would open its
    server beyond the host, `--port` collide between jobs, `--max-num-seqs` undo the batch."""
    for args, named in (([ "--host", "0.0.0.0"], "--host"), (["--port=8000"], "--port=8000"),
                        (["--enforce-eager", "--max-num-seqs", "8"], "--max-num-seqs")):  # fmt: skip
        cfg["models"]["opt125m"]["engine_args"] = args
        validate(cfg, SCHEMA)
        with pytest.raises(ConfigError, match=rf"models\.opt125m\.engine_args: {named} is set by slmserve"):
            check(cfg, ROOT)
    cfg["models"]["opt125m"]["engine_args"] = ["--enforce-eager", "--attention-backend", "TRITON_ATTN"]
    check(cfg, ROOT)
    spec = ServerSpec(model="m", served_name="m", log_path=Path("x.log"), max_num_seqs=8, max_model_len=64,
                      extra_args=("--host", "0.0.0.0"))  # fmt: skip
    with pytest.raises(ValueError, match="extra vLLM arguments --host: slmserve sets these itself"):
        spec.argv(1234)


def test_a_models_own_request_counts_override_the_workload_and_nothing_else(cfg: dict) -> None:
    from types import SimpleNamespace

    from slmserve.runner import requests_for

    cfg["workload"]["min_requests"] = 16
    cfg["models"]["opt13b"]["workload"] = {"rounds_per_batch": 64}
    validate(cfg, SCHEMA)  # fills defaults: none may stand in for a key the model's workload leaves out
    big, small = model_workload(cfg, "opt13b"), model_workload(cfg, "opt1.3b")
    assert (big["rounds_per_batch"], big["min_requests"], big["num_requests"]) == (64, 16, 500)
    assert (small["rounds_per_batch"], small["min_requests"]) == (None, 16)
    job = SimpleNamespace(**{k: big[k] for k in ("num_requests", "rounds_per_batch", "min_requests")})
    assert [requests_for(job, b) for b in (1, 2, 4, 8, 512)] == [64, 128, 256, 500, 500]  # type: ignore[arg-type]


def test_sweeps_take_a_models_request_counts_and_probes_keep_the_workloads(cfg: dict) -> None:
    """rules/common.smk's job_params, evaluated as Snakemake does (plain Python with ``config``)."""
    from types import SimpleNamespace

    cfg["models"]["opt13b"]["workload"] = {"rounds_per_batch": 64}
    validate(cfg, SCHEMA)
    smk = {"config": cfg, "workflow": SimpleNamespace(basedir=str(ROOT))}
    exec(compile((ROOT / "rules/common.smk").read_text(), "rules/common.smk", "exec"), smk)
    assert smk["job_params"]("opt13b", batch_sizes=[1], requests=True)["rounds_per_batch"] == 64
    assert smk["job_params"]("opt1.3b", batch_sizes=[1], requests=True)["rounds_per_batch"] is None
    # a probe measures no requests: the model's counts would only make the params trigger rerun it
    assert smk["job_params"]("opt13b", batch_control=None, requests=False)["rounds_per_batch"] is None


def test_context_window_must_hold_workload(cfg: dict) -> None:
    cfg["engine"]["max_model_len"] = 700
    with pytest.raises(ConfigError, match=r"engine\.max_model_len: 700 cannot hold .* 768 tokens"):
        check(cfg, ROOT)


def test_rates() -> None:
    assert math.isinf(parse_rate("inf")) and parse_rate(10) == 10.0
    assert rate_label(math.inf) == "inf" and rate_label(100.0) == "100" and rate_label(2.5) == "2.5"
    for bad in ("fast", 0, -3):
        with pytest.raises(ConfigError, match="allowed values are a positive number or 'inf'"):
            parse_rate(bad)


def _job_counts(stdout: str) -> dict[str, int]:
    table = stdout.split("Job stats:")[1].split("Reasons:")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.mark.parametrize("resources", [[], ["--resources", "gpu=4"]])
def test_dry_run_paper_dag(resources: list[str], tmp_path: Path) -> None:
    out = snakemake("all", "-n", "--cores", "4", *resources, "--config", f"outdir={tmp_path}/results",
                    f"figdir={tmp_path}/figs")  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    counts = _job_counts(out.stdout)
    # 6 OPT models x 3 GPU counts + 3 other families on one GPU, one sweep job each (all batch sizes inside)
    assert counts["sweep"] == 21
    assert counts["kv_probe"] == 10  # Table 1: 5 models x (36 GB, whole GPU)
    assert counts["replication"] == 9  # 3 models x 1-3 replicas
    assert counts["replication_plan"] == 6  # 3 models x the advisor's plan, plain and under MPS
    assert counts["output_lengths"] == 1  # OPT-6.7B: 4 output lengths x 3 rates on one server
    assert counts["summarize"] == 4 and counts["table1"] == 1 and counts["advisor"] == 1 and counts["all"] == 1
    assert sum(v for k, v in counts.items() if k.startswith("figure_")) == 12
    assert counts["calibration"] == 2 and counts["calibration_table"] == 1  # OPT-125M, 1.3B on this machine
    assert counts["total"] == 70


def _machine_m1_beside_m0(tmp_path: Path) -> tuple[Path, Path]:
    """A config naming this machine h100-test-m1, and machine h100-test-m0's calibration file under outdir."""
    cfg = tmp_path / "m1.yaml"
    cfg.write_text(yaml.safe_dump({"calibration": {"models": ["opt125m", "opt1.3b"], "machine": "h100-test-m1"}}))
    other = tmp_path / "results/calibration/h100-test-m0/opt125m.requests.parquet"
    other.parent.mkdir(parents=True)
    other.write_bytes(b"measured on another machine")
    return cfg, other


def test_each_machine_plans_its_own_calibration_first(tmp_path: Path) -> None:
    """The paper profile plans this machine's calibration point (named by calibration.machine here), at the
    highest priority so that it starts before the other jobs; another machine's point already measured is
    not re-run, and the calibration table lists both machines."""
    cfg, other = _machine_m1_beside_m0(tmp_path)
    out = snakemake("all", "-n", "--cores", "4", "--resources", "gpu=1", "--configfile", str(cfg),
                    "--config", f"outdir={tmp_path}/results", f"figdir={tmp_path}/figs")  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    counts = _job_counts(out.stdout)
    assert counts["calibration"] == 2 and counts["calibration_table"] == 1
    jobs = out.stdout.split("rule calibration:")[1:]
    assert all("priority: 100" in job.split("\n\n")[0] for job in jobs) and len(jobs) == 2
    assert "wildcards: machine=h100-test-m1, model=opt125m" in out.stdout
    assert "machine=h100-test-m0" not in out.stdout
    table_job = out.stdout.split("rule calibration_table:")[1].split("\n\n")[0]
    assert str(other) in table_job and "h100-test-m1/opt1.3b.requests.parquet" in table_job


def test_calibrate_plans_this_machines_point_and_nothing_else(tmp_path: Path) -> None:
    """Named as a target, ``calibrate`` plans this machine's two points (and their prompts), not another
    machine's: a calibration table named instead plans nothing once it exists (2026-11-24, H100)."""
    cfg, _ = _machine_m1_beside_m0(tmp_path)
    args = ("-n", "--cores", "4", "--resources", "gpu=1", "--configfile", str(cfg), "--config",
            f"outdir={tmp_path}/results", f"figdir={tmp_path}/figs")  # fmt: skip
    out = snakemake("calibrate", *args)
    assert out.returncode == 0, out.stderr[-2000:]
    counts = _job_counts(out.stdout)
    assert counts == {"calibrate": 1, "calibration": 2, "prepare_dataset": 1, "total": 4}
    assert "wildcards: machine=h100-test-m1, model=opt1.3b" in out.stdout
    assert "machine=h100-test-m0" not in out.stdout


def test_dry_run_smoke_dag(tmp_path: Path) -> None:
    out = snakemake("all", "-n", "--cores", "2", "--configfile", "config/smoke.yaml", "--config", f"outdir={tmp_path}")
    assert out.returncode == 0, out.stderr[-2000:]
    counts = _job_counts(out.stdout)
    figs = {k: v for k, v in counts.items() if k.startswith("figure_")}
    assert set(figs) == {f"figure_{name}" for name in FIGURES} and set(figs.values()) == {1}
    assert counts["summarize"] == len(EXPERIMENTS)  # one summary per experiment of the registry
    rest = {k: v for k, v in counts.items() if not k.startswith("figure_")}
    assert rest == {"prepare_dataset": 1, "kv_probe": 1, "sweep": 1, "output_lengths": 1, "replication": 2,
                    "replication_plan": 2, "summarize": 4, "table1": 1, "advisor": 1, "all": 1,
                    "total": 27}  # fmt: skip


def _aged_copy(src: Path, dst: Path) -> None:
    """Committed results copied to ``dst`` (prompts left out), older than every script and config, as a checkout
    may leave them: a test of what `all` plans must not depend on the file times."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("data"))
    for path in dst.rglob("*"):
        os.utime(path, (1e9, 1e9))


def test_paper_dag_plans_only_the_probes_missing_from_results(tmp_path: Path) -> None:
    """results/capacity holds every Table 1 probe of the paper profile (5 models, 36 GB and whole GPU) and the
    family models' probes, measured on H100s: `all` re-runs none of them, whatever the file times; with one
    taken away, exactly that one is planned; every sweep of the paper is still planned."""
    committed = ROOT / "results/capacity"
    opts = ("opt125m", "opt1.3b", "opt2.7b", "opt6.7b", "opt13b")
    table1 = {f"{m}-{b}.json" for m in opts for b in ("36gb", "whole")}
    families = {f"{m}-whole.json" for m in ("llama7b", "gptj6b", "mpt7b")}
    assert table1 | families <= {p.name for p in committed.glob("*.json")}
    out = tmp_path / "results"
    _aged_copy(committed, out / "capacity")

    def planned() -> tuple[dict[str, int], str]:
        proc = snakemake("all", "-n", "--cores", "4", "--config", f"outdir={out}", f"figdir={tmp_path}/figs")
        assert proc.returncode == 0, proc.stderr[-2000:]
        return _job_counts(proc.stdout), proc.stdout

    counts, _ = planned()
    assert "kv_probe" not in counts and counts["table1"] == 1
    assert counts["sweep"] == 21  # 6 OPT models x 1, 2, 4 GPUs and 3 family models
    (out / "capacity/opt13b-whole.json").unlink()
    counts, stdout = planned()
    assert counts["kv_probe"] == 1 and "wildcards: model=opt13b, budget=whole" in stdout


@pytest.mark.parametrize("resources", [[], ["--resources", "gpu=4"]])
def test_dry_run_named_targets(resources: list[str], tmp_path: Path) -> None:
    """Each named target builds exactly what it needs (from an empty results folder)."""
    cases = {
        "results/replication/opt125m_r3.parquet": {"prepare_dataset": 1, "kv_probe": 1, "replication": 1},
        "paper_figures/table1.md": {"kv_probe": 10, "table1": 1},
        "paper_figures/throughput_latency.png": {"prepare_dataset": 1, "sweep": 18, "summarize": 1,
                                                 "figure_throughput_latency": 1},
        "paper_figures/output_lengths.png": {"prepare_dataset": 1, "kv_probe": 1, "output_lengths": 1,
                                             "summarize": 1, "figure_output_lengths": 1},
        # the advisor's plans need their models' one-GPU sweeps and the probes (whole GPU and 36 GB)
        "paper_figures/replication_power.png": {"prepare_dataset": 1, "kv_probe": 6, "replication": 9,
                                                "sweep": 3, "replication_plan": 6, "summarize": 1,
                                                "figure_replication_power": 1},
        "demo": {"prepare_dataset": 1, "sweep": 18, "summarize": 1, "figure_throughput_latency": 1, "demo": 1},
    }  # fmt: skip
    for target, expected in cases.items():
        target = target.replace("results/", f"{tmp_path}/results/").replace("paper_figures/", f"{tmp_path}/figs/")
        out = snakemake(target, "-n", "--cores", "4", *resources, "--config", f"outdir={tmp_path}/results",
                        f"figdir={tmp_path}/figs")  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        counts = _job_counts(out.stdout)
        counts.pop("total")
        assert counts == expected, target


def test_bad_config_fails_before_any_job(tmp_path: Path) -> None:
    bad = copy.deepcopy(yaml.safe_load((ROOT / "config/smoke.yaml").read_text()))
    bad["experiments"]["sweep"]["batch_sizes"] = [1, 0]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    out = snakemake("all", "-n", "--cores", "1", "--configfile", str(tmp_path / "bad.yaml"))
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "0 is less than the minimum of 1" in text and "batch_sizes" in text
    assert "Job stats" not in text

    bad["experiments"]["sweep"]["batch_sizes"] = [1]
    bad["experiments"]["sweep"]["models"] = ["opt-125m"]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    out = snakemake("all", "-n", "--cores", "1", "--configfile", str(tmp_path / "bad.yaml"))
    assert out.returncode != 0
    assert "unknown model 'opt-125m'" in out.stdout + out.stderr


def test_dry_run_quick_profile(tmp_path: Path) -> None:
    out = snakemake("all", "-n", "--cores", "4", "--resources", "gpu=1", "--configfile", "config/quick.yaml",
                    "--config", f"outdir={tmp_path}/results", f"figdir={tmp_path}/figs")  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    counts = _job_counts(out.stdout)
    # one server per model for the sweep (client batch control), Table 1 probes, 3 models x 1-3 replicas
    assert counts["sweep"] == 3 and counts["kv_probe"] == 6 and counts["replication"] == 9
    assert counts["replication_plan"] == 6  # the advisor's plan of each model, plain and under MPS
    assert sum(v for k, v in counts.items() if k.startswith("figure_")) == 10
    assert "figure_families" not in counts and "figure_output_lengths" not in counts
    assert counts["advisor"] == 1  # the batching advisor of the sweep, from the Table 1 probes
    assert counts["total"] == 40


def test_one_model_quick_profile_is_the_quick_profiles_opt13b_jobs(tmp_path: Path) -> None:
    """config/quick-opt1.3b.yaml claims the GPU time of the quick profile's OPT-1.3B jobs: it must measure them
    with the same settings (all but the model lists, names and folders) and plan exactly those 6 GPU jobs."""
    one, quick = (yaml.safe_load((ROOT / "config/config.yaml").read_text()) for _ in range(2))
    for c, name in ((one, "quick-opt1.3b"), (quick, "quick")):
        update_config(c, yaml.safe_load((ROOT / f"config/{name}.yaml").read_text()))  # as --configfile does
        validate(c, SCHEMA)
        check(c, ROOT)
    ex_one, ex_quick = one.pop("experiments"), quick.pop("experiments")
    for key in ("profile", "outdir", "figdir", "calibration"):
        one.pop(key), quick.pop(key)
    assert one == quick  # workload, engine, telemetry, models
    for name in ("table1", "sweep", "replication"):
        ex_quick[name]["models"] = ["opt1.3b"]
    ex_quick["replication"]["advisor_plan"]["variants"] = []
    assert ex_one == ex_quick

    out = snakemake("all", "-n", "--cores", "4", "--resources", "gpu=1", "--configfile", "config/quick-opt1.3b.yaml",
                    "--config", f"outdir={tmp_path}/results", f"figdir={tmp_path}/figs")  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    counts = _job_counts(out.stdout)
    assert (counts["kv_probe"], counts["sweep"], counts["replication"]) == (2, 1, 3)  # its only GPU jobs
    cpu = {"prepare_dataset", "summarize", "table1", "advisor", "all", "total"}
    assert {k for k in counts if not k.startswith("figure_")} == {"kv_probe", "sweep", "replication"} | cpu
    assert sum(v for k, v in counts.items() if k.startswith("figure_")) == 10


@pytest.mark.parametrize("again_name", ["quick-opt1.3b-rerun", "quick-opt1.3b-h100"])
def test_rerun_profile_is_the_one_model_quick_profile_measured_again(tmp_path: Path, again_name: str) -> None:
    """config/quick-opt1.3b-rerun.yaml (set beside config/quick-opt1.3b.yaml point by point, bench/rerun.py) and
    config/quick-opt1.3b-h100.yaml (its timing on one H100) are the one-model quick profile measured again: only
    their names and folders may differ, and their committed results are complete (`all` measures nothing)."""
    names = ("quick-opt1.3b", again_name)
    one, again = (yaml.safe_load((ROOT / f"config/{n}.yaml").read_text()) for n in names)
    assert {k for k in one.keys() | again.keys() if one.get(k) != again.get(k)} == {"profile", "outdir", "figdir"}
    committed = ROOT / again["outdir"]
    if not (committed / "capacity").exists():
        pytest.skip(f"{again['outdir']} not in this checkout")
    out = tmp_path / "results"
    _aged_copy(committed, out)
    proc = snakemake("all", "-n", "--cores", "4", "--resources", "gpu=1", "--configfile", f"config/{names[1]}.yaml",
                     "--config", f"outdir={out}", f"figdir={tmp_path}/figs")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not {"kv_probe", "sweep", "replication", "replication_plan"} & set(_job_counts(proc.stdout))


def test_quick_profile_resumes_from_the_committed_h100_results(tmp_path: Path) -> None:
    """results/quick holds the quick profile measured on an H100 (all 18 GPU jobs of the paper's part):
    whatever the checkout's file times, `all` re-runs no measurement (the prompts are rebuilt, not the runs)
    and plans only those of the advisor's plans (3 models x plain, MPS) not committed yet; with a sweep point and a
    replication run taken away, exactly those two jobs are planned."""
    committed = ROOT / "results/quick"
    if not (committed / "capacity").exists():
        pytest.skip("results/quick not in this checkout")
    out = tmp_path / "results"
    _aged_copy(committed, out)

    no_plans = tmp_path / "no-plans.yaml"
    no_plans.write_text("experiments:\n  replication:\n    advisor_plan:\n      variants: []\n")

    def planned(*configs: Path) -> tuple[dict[str, int], str]:
        proc = snakemake("all", "-n", "--cores", "4", "--resources", "gpu=1", "--configfile", "config/quick.yaml",
                         *map(str, configs), "--config", f"outdir={out}", f"figdir={tmp_path}/figs")  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        return _job_counts(proc.stdout), proc.stdout

    plans = {f"{m}_advisor-{v}" for m in ("opt125m", "opt1.3b", "opt2.7b") for v in ("plain", "mps")}
    measured = {p.stem for p in (out / "replication").glob("*_advisor-*.parquet") if ".telemetry" not in p.name}
    assert measured <= plans, measured
    counts, stdout = planned()
    assert not {"kv_probe", "sweep", "replication"} & set(counts), counts
    assert counts.get("replication_plan", 0) == len(plans - measured)  # the profile's only missing measurements
    outputs = " ".join(line for line in stdout.splitlines() if line.strip().startswith("output:"))
    assert {name for name in plans if f"replication/{name}.parquet" in outputs} == plans - measured
    counts, _ = planned(no_plans)
    assert not {"kv_probe", "sweep", "replication", "replication_plan"} & set(counts), counts
    assert "prepare_dataset" not in counts  # finished jobs do not even list the prompts
    (out / "runs/opt1.3b/tp1-out256-rateinf/bs64.requests.parquet").unlink()
    (out / "replication/opt2.7b_r2.parquet").unlink()
    counts, stdout = planned(no_plans)
    assert counts.get("kv_probe", 0) == 0 and counts["sweep"] == 1 and counts["replication"] == 1
    assert "wildcards: model=opt1.3b, tp=1, out=256, rate=inf" in stdout
    assert "wildcards: model=opt2.7b, n=2" in stdout


def test_every_profile_leaves_out_the_script_mtime_code_trigger() -> None:
    """Snakemake's "code" trigger reruns jobs whose script file is newer than their outputs: on a fresh clone
    (arbitrary file times) it would redo committed GPU measurements. Every profile must drop it."""
    profiles = sorted((ROOT / "profiles").glob("*/config.yaml"))
    assert {p.parent.name for p in profiles} >= {"default", "local", "slurm"}
    for path in profiles:
        triggers = yaml.safe_load(path.read_text()).get("rerun-triggers")
        assert triggers == ["mtime", "params", "software-env"], path


def test_dry_run_quick_tp_profile(tmp_path: Path) -> None:
    """The 4-GPU host's set: four models on 1, 2 and 4 GPUs, batch 1..512, one job (one server) each with the
    batch capped in the scheduler, this machine's calibration point first; a job declares its GPU count."""
    out = snakemake("all", "-n", "--cores", "16", "--resources", "gpu=4", "--configfile", "config/quick-tp.yaml",
                    "--config", f"outdir={tmp_path}/results", f"figdir={tmp_path}/figs")  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    counts = _job_counts(out.stdout)
    assert counts["sweep"] == 12 and counts["calibration"] == 2 and "kv_probe" not in counts
    assert "replication" not in counts and "output_lengths" not in counts
    assert counts["advisor"] == 1  # no Table 1 probes: the advisor's analytic memory figures only
    for model in ("opt125m", "opt1.3b", "opt6.7b", "opt13b"):
        for tp in (1, 2, 4):
            assert f"wildcards: model={model}, tp={tp}, out=256, rate=inf" in out.stdout
    gpus = {m[1]: m[2] for m in re.finditer(r"wildcards: model=(\S+, tp=\d), .*\n(?:.*\n)*?\s+resources: .*gpu=(\d)",
                                             out.stdout)}  # fmt: skip
    assert {gpus[f"opt13b, tp={tp}"] for tp in (1, 2, 4)} == {"1", "2", "4"}
    assert re.search(r"bs1\.requests\.parquet", out.stdout) and re.search(r"bs512\.requests\.parquet", out.stdout)
    tp = yaml.safe_load((ROOT / "config/quick-tp.yaml").read_text())
    paper = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    assert "engine" not in tp and paper["engine"]["batch_control"] == "scheduler"  # the paper's cap, inherited


@pytest.mark.parametrize("profile", ["config/a100-36gb.yaml", "config/h200-36gb.yaml"])
def test_dry_run_a100_budget_replication_profile(profile: str, tmp_path: Path) -> None:
    """Figures 5-7 in the paper's memory setting (on an H100, or an H200 with probes of its own): the 36 GB
    probes size the replicas (not the whole GPU's), and the machine's calibration point keeps the whole GPU's
    share."""
    out = snakemake("all", "-n", "--cores", "4", "--resources", "gpu=1", "--configfile", profile,
                    "--config", f"outdir={tmp_path}/results", f"figdir={tmp_path}/figs")  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    counts = _job_counts(out.stdout)
    assert counts["replication"] == 9 and counts["kv_probe"] == 3 and counts["calibration"] == 2
    assert not {"sweep", "replication_plan", "table1", "advisor"} & set(counts), counts
    for model in ("opt125m", "opt1.3b", "opt2.7b"):
        assert f"wildcards: model={model}, budget=36gb" in out.stdout
        assert f"capacity/{model}-36gb.json" in out.stdout
    assert "-whole.json" not in out.stdout


def test_dry_run_tp2_profile(tmp_path: Path) -> None:
    """The 2-GPU host's set: four models on 1 and 2 GPUs, one job (one server) each, this machine's
    calibration point first; a two-GPU job takes both GPUs, so only one-GPU jobs run side by side."""
    out = snakemake("all", "-n", "--cores", "8", "--resources", "gpu=2", "--configfile", "config/tp2.yaml",
                    "--config", f"outdir={tmp_path}/results", f"figdir={tmp_path}/figs")  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    counts = _job_counts(out.stdout)
    assert counts["sweep"] == 8 and counts["calibration"] == 2 and "kv_probe" not in counts
    assert "replication" not in counts and "output_lengths" not in counts
    for model in ("opt125m", "opt1.3b", "opt6.7b", "opt13b"):
        for tp in (1, 2):
            assert f"wildcards: model={model}, tp={tp}, out=256, rate=inf" in out.stdout
    gpus = {m[1]: m[2] for m in re.finditer(r"wildcards: model=(\S+, tp=\d), .*\n(?:.*\n)*?\s+resources: .*gpu=(\d)",
                                             out.stdout)}  # fmt: skip
    assert gpus["opt13b, tp=2"] == "2" and gpus["opt13b, tp=1"] == "1" and gpus["opt125m, tp=1"] == "1"
    assert f"{tmp_path}/figs/throughput_latency.png" in out.stdout


def test_dry_run_h200_profile(tmp_path: Path) -> None:
    """config/h200.yaml: the probe-sized jobs (Figure 2 right, Figures 5-7) read this outdir's whole-GPU
    probes, never the paper profile's (an H100's), and plan no sweep, advisor plan or 36 GB probe."""
    out = snakemake("all", "-n", "--cores", "4", "--resources", "gpu=1", "--configfile", "config/h200.yaml",
                    "--config", f"outdir={tmp_path}/results", f"figdir={tmp_path}/figs")  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    counts = _job_counts(out.stdout)
    assert counts["kv_probe"] == 4 and counts["output_lengths"] == 1 and counts["replication"] == 9, counts
    assert not {"sweep", "replication_plan", "advisor"} & set(counts), counts
    for model in ("opt6.7b", "opt125m", "opt1.3b", "opt2.7b"):
        assert f"{tmp_path}/results/capacity/{model}-whole.json" in out.stdout
    assert "-36gb.json" not in out.stdout and " results/capacity/" not in out.stdout


def test_rates_read_from_strings_and_label_without_exponents() -> None:
    """A path's rate wildcard is a string ("10"); a label never takes an exponent its wildcard cannot match."""
    from slmserve.layout import WILDCARDS

    assert parse_rate("10") == 10.0 and parse_rate("0.5") == 0.5 and math.isinf(parse_rate("Infinity"))
    for bad in ("nan", "", "10/s", None):
        with pytest.raises(ConfigError, match="allowed values are a positive number or 'inf'"):
            parse_rate(bad)
    labels = [rate_label(r) for r in (1e-5, 1e6, 0.1, 10.0)]
    assert labels == ["0.00001", "1000000", "0.1", "10"]
    assert all(re.fullmatch(WILDCARDS["rate"], label) for label in labels)
