"""CPU placement (slmserve.pinning) and its benchmark's glue, on this host's real processes: a stand-in
server tree (a shell whose child names itself like vLLM's engine core) takes the place of a vLLM server."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import batch_control, cpu_pinning
from slmserve import pinning


def fake_sysfs(root: Path, topology: dict[int, tuple[int, int]]) -> Path:
    for cpu, (pkg, core) in topology.items():
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{pkg}\n")
        (topo / "core_id").write_text(f"{core}\n")
    return root


def test_physical_cores_group_smt_siblings(tmp_path: Path) -> None:
    # 2 packages x 2 cores x 2 threads, siblings numbered as Linux does (cpu n and n + 4)
    topo = {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1), 4: (0, 0), 5: (0, 1), 6: (1, 0), 7: (1, 1)}
    sysfs = fake_sysfs(tmp_path, topo)
    assert pinning.physical_cores(range(8), sysfs) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert pinning.physical_cores([1, 5, 6], sysfs) == [(1, 5), (6,)]


def test_plan_takes_disjoint_cores_from_the_end() -> None:
    cores = [(0, 4), (1, 5), (2, 6), (3, 7)]
    p = pinning.plan(cores, per_role=1)
    assert p.as_dict() == {"engine": [1, 5], "api": [2, 6], "client": [3, 7]}
    with pytest.raises(ValueError, match=r"needs 6 physical cores \(2 per role\); this host has 4 \(8 logical"):
        pinning.plan(cores, per_role=2)


def test_cpu_engine_ranks_share_the_cores_or_take_a_numa_node_each(tmp_path: Path) -> None:
    # One node, 4 physical cores with SMT siblings (cpu n and n + 4): one logical CPU per core, as vLLM does on x86
    one = fake_sysfs(tmp_path / "one", {c: (0, c % 4) for c in range(8)})
    assert pinning.cpu_engine_ranks(2, range(8), one) == "4,5|6,7"
    assert pinning.cpu_engine_ranks(4, range(8), one) == "4|5|6|7"
    assert pinning.cpu_engine_ranks(3, range(8), one) == "4|5|6"  # an equal share; the last core stays free
    # Two nodes of 2 cores: a rank per node, even where an equal share would cut across them differently
    two = fake_sysfs(tmp_path / "two", {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1), 4: (1, 2), 5: (1, 3)})
    for cpu in range(6):
        (two / f"cpu{cpu}" / f"node{0 if cpu < 2 else 1}").mkdir()
    assert pinning.cpu_engine_ranks(2, range(6), two) == "0,1|2,3,4,5"
    assert pinning.cpu_engine_ranks(3, range(6), two) == "0,1|2,3|4,5"  # 3 ranks, 2 nodes: an equal share
    assert pinning.cpu_engine_ranks(2, [0, 4], one) == "0|4"  # one core, two SMT siblings: a sibling each
    with pytest.raises(ValueError, match=r"tensor_parallel 4 on the CPU engine needs a CPU per rank; "
                                         r"this process may use 3: .*VLLM_CPU_OMP_THREADS_BIND"):  # fmt: skip
        pinning.cpu_engine_ranks(4, [0, 4, 1], one)


@pytest.fixture
def server_tree():
    """A stand-in server: a shell (the 'API server') with a child whose command line names it VLLM::EngineCore."""
    proc = subprocess.Popen(["bash", "-c", '(exec -a "$NAME" sleep 60) & sleep 60'], start_new_session=True,
                            env={**os.environ, "NAME": "VLLM::EngineCore"})  # fmt: skip
    import psutil

    for _ in range(200):  # until both children run: the subshell exec'd into the named one, and the other sleep
        children = psutil.Process(proc.pid).children()
        if len(children) == 2 and any(pinning.is_engine_core(c) for c in children):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the stand-in server's children did not start: {children}")
    own = os.sched_getaffinity(0)
    yield proc
    os.sched_setaffinity(0, own)
    os.killpg(proc.pid, 9)
    proc.wait()


def _affinity(pid: int) -> set[int]:
    return os.sched_getaffinity(pid)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_apply_pins_each_role_then_releases(server_tree) -> None:
    import psutil

    a, b = sorted(os.sched_getaffinity(0))[:2]
    plan = pinning.Plan(engine=frozenset({a}), api=frozenset({b}), client=frozenset({a, b}))
    counts = pinning.apply(server_tree.pid, plan)
    engine = next(p for p in psutil.Process(server_tree.pid).children() if pinning.is_engine_core(p))
    assert (_affinity(engine.pid), _affinity(server_tree.pid), _affinity(0)) == ({a}, {b}, {a, b})
    assert counts["engine"] == 1 and counts["api"] >= 2 and counts["client"] >= 1
    pinning.apply(server_tree.pid, frozenset({a, b}))
    assert _affinity(engine.pid) == _affinity(server_tree.pid) == {a, b}


def test_apply_refuses_a_plan_without_an_engine_core() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        plan = pinning.Plan(engine=frozenset({0}), api=frozenset({0}), client=frozenset(os.sched_getaffinity(0)))
        with pytest.raises(ValueError, match="no vLLM engine core among the server's processes"):
            pinning.apply(proc.pid, plan)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_benchmark_places_before_every_run_and_records_it(tmp_path: Path, server_tree, monkeypatch) -> None:
    a, b = sorted(os.sched_getaffinity(0))[:2]
    monkeypatch.setattr(pinning, "physical_cores", lambda: [(a,), (b,), (a,)])
    seen = []

    def fake_alternate(by, batches, repeats, label, before):  # stands in for the GPU measurement loop
        srv = argparse.Namespace(proc=server_tree)
        for r in range(repeats):
            for name in batch_control.order(tuple(by), r):
                before(name, srv)
                seen.append((name, _affinity(server_tree.pid)))

    monkeypatch.setattr(cpu_pinning, "alternate", fake_alternate)
    args = argparse.Namespace(model="opt125m", prompts=tmp_path / "p.parquet", out=tmp_path, batches=[64], repeats=2,
                              per_role=1, graphs=512, requests=1500, output_len=None, dtype=None)  # fmt: skip
    cpu_pinning.run(args)
    assert seen == [("pinned", {b}), ("unpinned", {a, b}), ("unpinned", {a, b}), ("pinned", {b})]
    record = json.loads((tmp_path / "opt125m/placement.json").read_text())
    assert record["plan"] == {"engine": [a], "api": [b], "client": [a]}
    assert [t["setting"] for t in record["threads_set"]] == ["pinned", "unpinned", "unpinned", "pinned"]
