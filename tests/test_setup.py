"""envs/setup.sh: the venv it builds is byte-compiled, so no process compiles torch or vLLM again."""

from __future__ import annotations

import importlib.util
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.mark.skipif(Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(),
                    reason="checks the venv envs/setup.sh builds: run `make test`")  # fmt: skip
@pytest.mark.parametrize("package", ["vllm", "torch", "transformers", "snakemake", "polars"])
def test_the_venv_is_byte_compiled(package: str) -> None:
    # Imports cache only the modules they load, and not at all under PYTHONDONTWRITEBYTECODE: without setup's
    # compileall most of a package has no .pyc.
    files = list((Path(sysconfig.get_paths()["purelib"]) / package).rglob("*.py"))
    assert files, f"{package} not installed in {sys.prefix}"
    missing = [f for f in files if not Path(importlib.util.cache_from_source(str(f))).exists()]
    assert len(missing) <= 0.01 * len(files), f"{len(missing)} of {len(files)} {package} files lack a .pyc"
