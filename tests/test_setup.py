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
    spec = importlib.util.find_spec(package)
    assert spec and spec.origin, f"{package} is not installed"
    where, venv = Path(spec.origin).parent, Path(sysconfig.get_paths()["purelib"])
    if not where.is_relative_to(venv):  # an offline host's preinstalled engine: setup compiles only its venv
        pytest.skip(f"{package} is the host's ({where}), not the venv's")
    files = list(where.rglob("*.py"))
    missing = [f for f in files if not Path(importlib.util.cache_from_source(str(f))).exists()]
    assert len(missing) <= 0.01 * len(files), f"{len(missing)} of {len(files)} {package} files lack a .pyc"
