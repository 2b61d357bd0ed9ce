"""workflow/scripts/common: a rule's script imports it as a sibling, and it builds the rule's SweepJob."""

from __future__ import annotations

import importlib.util
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

from tests.conftest import ROOT, snakemake

COMMON = ROOT / "workflow/scripts/common.py"


def _common():
    spec = importlib.util.spec_from_file_location("common", COMMON)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sweep_job_from_the_rules_params(tmp_path: Path) -> None:
    job = {"model": "opt125m", "model_path": "config/models/opt-125m", "load_format": "dummy", "tensor_parallel": 1,
           "batch_sizes": [1, 2], "input_len": 16, "output_len": 8, "num_requests": 4, "arrival_rate": math.inf,
           "fits": "admission"}  # fmt: skip
    rule = SimpleNamespace(params=SimpleNamespace(job=job, prompts="p.parquet"), log=[str(tmp_path / "x/sweep.log")],
                           config={"allow_cpu": False})  # fmt: skip
    outputs = {1: (Path("a"), Path("b"))}
    built = _common().sweep_job(rule, outputs)
    assert (built.model, built.batch_sizes, built.prompts_path, built.outputs) == ("opt125m", [1, 2], Path("p.parquet"),
                                                                                   outputs)  # fmt: skip
    assert built.log_dir == tmp_path / "x/sweep"
    assert built.allow_cpu is False  # a GPU profile's job refuses a node without GPUs
    assert "allow_cpu" not in built.describe()  # nor is it a setting of the measurement
    probe = _common().sweep_job(rule, prompts="-", batch_sizes=[4])
    assert (probe.prompts_path, probe.batch_sizes, probe.outputs) == (Path("-"), [4], {})
    assert job["batch_sizes"] == [1, 2]  # the rule's params are left as they are


def test_a_rule_script_imports_common_from_its_folder(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(COMMON, tmp_path / "scripts/common.py")
    (tmp_path / "scripts/use.py").write_text(
        "import logging\nfrom common import log_to_file\n\nlog_to_file(snakemake)\nlogging.info('hello')\n"
        "open(snakemake.output[0], 'w').write('ok')\n"
    )
    (tmp_path / "Snakefile").write_text(
        'rule use:\n    output: "out.txt"\n    log: "use.log"\n    script: "scripts/use.py"\n'
    )
    proc = snakemake("--cores", "1", "--snakefile", str(tmp_path / "Snakefile"), "--directory", str(tmp_path),
                     cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "out.txt").read_text() == "ok"
    assert "INFO root: hello" in (tmp_path / "use.log").read_text()
