"""Provenance: the commit a result was made from, also from a copy of the tree without .git."""

import subprocess

from slmserve import provenance
from slmserve.machine import machine_id


def _checkout(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "f").write_text("1")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    return repo, head


def test_git_sha_of_a_checkout_is_its_head(tmp_path, monkeypatch):
    monkeypatch.delenv("SLMSERVE_GIT_SHA", raising=False)
    repo, head = _checkout(tmp_path)
    assert provenance.git_sha(repo) == head
    (repo / "f").write_text("2")
    assert provenance.git_sha(repo) == head + "-dirty"


def test_git_sha_of_an_exported_tree_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("SLMSERVE_GIT_SHA", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert provenance.git_sha(tmp_path) is None
    monkeypatch.setenv("SLMSERVE_GIT_SHA", "0123abc")
    assert provenance.git_sha(tmp_path) == "0123abc"


def test_the_commit_a_tree_was_sent_from_wins_over_a_stale_git_copied_with_it(tmp_path, monkeypatch):
    repo, _ = _checkout(tmp_path)
    monkeypatch.setenv("SLMSERVE_GIT_SHA", "0123abc")
    assert provenance.git_sha(repo) == "0123abc"


def test_config_hash_ignores_key_order_and_sees_values():
    assert provenance.config_hash({"a": 1, "b": [1, 2]}) == provenance.config_hash({"b": [1, 2], "a": 1})
    assert provenance.config_hash({"a": 1}) != provenance.config_hash({"a": 2})


def test_every_result_names_the_host_cpu_and_its_cores():
    prov = provenance.collect({"x": 1}, ())
    assert prov["cpu_model"] and prov["cpu_cores"] >= 1 and 1 <= prov["cpu_cores_usable"] <= prov["cpu_cores"]
    assert {"engine", "engine_version", "torch", "gpu_models", "driver", "gpu_ids", "slurm_job_id", "git_sha",
            "config_hash", "created", "hostname", "machine"} <= set(prov)  # fmt: skip
    assert prov["machine"] == machine_id()  # the calibration table's name for this machine


def test_a_machine_nvml_cannot_name_is_recorded_as_none(monkeypatch):
    """NVML failing part-way (a GPU in a bad state) leaves the machine unnamed, never the run failed."""

    def broken() -> str:
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    provenance.this_machine.cache_clear()
    monkeypatch.setattr(provenance, "machine_id", broken)
    try:
        assert provenance.collect({"x": 1}, ())["machine"] is None
    finally:
        provenance.this_machine.cache_clear()
