"""Host CPU placement: a vLLM server's engine core, its API server and the load generator, each on physical
cores of its own; and the CPU engine's tensor-parallel ranks, each on cores of its own.

For a host-bound model (OPT-125M on an H100 runs its GPU at 40-55% busy) throughput follows the host CPU, and
repeats on one server fall into a fast and a slow state (e.g. 139-141 against 167-172 req/s at batch 512).
The OS moves the busy threads between logical CPUs at will; where two of them share a physical core (SMT
siblings, or vCPUs that are siblings on the host) each runs slower. A :class:`Plan` gives the three roles
disjoint physical cores, read from sysfs, so that they never share one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

SYSFS = Path("/sys/devices/system/cpu")
ROLES = ("engine", "api", "client")


def physical_cores(allowed: Iterable[int] | None = None, sysfs: Path = SYSFS) -> list[tuple[int, ...]]:
    """The logical CPUs of ``allowed`` (default: this process's affinity) grouped by physical core (package
    and core id from sysfs topology), cores ordered by their lowest CPU."""
    cpus = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    groups: dict[tuple[int, int], list[int]] = {}
    for cpu in cpus:
        topo = sysfs / f"cpu{cpu}" / "topology"
        try:
            key = (int((topo / "physical_package_id").read_text()), int((topo / "core_id").read_text()))
        except (OSError, ValueError):
            key = (-1, cpu)  # no topology (some containers): every CPU its own core
        groups.setdefault(key, []).append(cpu)
    return sorted((tuple(g) for g in groups.values()), key=lambda g: g[0])


@dataclass(frozen=True)
class Plan:
    """Which logical CPUs each role may run on: ``engine`` (vLLM's engine core, which drives the GPU),
    ``api`` (the API server and any other process of the server) and ``client`` (the load generator and the
    telemetry sampler)."""

    engine: frozenset[int]
    api: frozenset[int]
    client: frozenset[int]

    def as_dict(self) -> dict[str, list[int]]:
        return {role: sorted(getattr(self, role)) for role in ROLES}


def plan(cores: list[tuple[int, ...]], per_role: int = 2) -> Plan:
    """``per_role`` physical cores (all their logical CPUs) for each role, taken from the end of ``cores``
    (CPU 0's side takes most interrupts). Raises :class:`ValueError` if there are fewer than 3 x ``per_role``
    physical cores."""
    need = len(ROLES) * per_role
    if per_role < 1 or len(cores) < need:
        raise ValueError(f"CPU pinning needs {need} physical cores ({per_role} per role); this host has "
                         f"{len(cores)} ({sum(map(len, cores))} logical CPUs): lower per_role")  # fmt: skip
    take = cores[-need:]
    sets = [frozenset(c for core in take[i * per_role : (i + 1) * per_role] for c in core) for i in range(3)]
    return Plan(engine=sets[0], api=sets[1], client=sets[2])


def _node(cpu: int, sysfs: Path) -> int:
    """The NUMA node of logical CPU ``cpu`` (sysfs's ``cpuN/nodeK`` link), -1 where sysfs does not say."""
    links = sorted((sysfs / f"cpu{cpu}").glob("node[0-9]*"))
    return int(links[0].name[4:]) if links else -1


def cpu_engine_ranks(tp: int, allowed: Iterable[int] | None = None, sysfs: Path = SYSFS) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``tp`` tensor-parallel ranks of the CPU engine: a CPU list per rank,
    ``|`` between ranks (``"0|1"``, ``"0,1|2,3"``), one logical CPU per physical core as vLLM's own binding
    takes on x86.

    vLLM's automatic binding gives each rank a NUMA node and refuses more ranks than nodes (a 2-core machine
    has one). Here each rank takes the physical cores of one node where ``allowed`` (default: this
    process's affinity) spans ``tp`` nodes, else an equal share of all of them in order; with fewer physical
    cores than ranks (SMT siblings of a small VM), a logical CPU each. Raises :class:`ValueError` with fewer
    logical CPUs than ranks."""
    cores = physical_cores(allowed, sysfs)
    if len(cores) < tp:
        cores = [(cpu,) for core in cores for cpu in core]
    if len(cores) < tp:
        raise ValueError(
            f"tensor_parallel {tp} on the CPU engine needs a CPU per rank; this process may use "
            f"{len(cores)}: lower tensor_parallel, or set VLLM_CPU_OMP_THREADS_BIND yourself (a CPU list "
            "per rank, '|' between them, e.g. '0-3|4-7')"
        )
    by_node: dict[int, list[tuple[int, ...]]] = {}
    for core in cores:
        by_node.setdefault(_node(core[0], sysfs), []).append(core)
    if len(by_node) >= tp:
        ranks = [by_node[n] for n in sorted(by_node)[:tp]]
    else:
        share = len(cores) // tp
        ranks = [cores[i * share : (i + 1) * share] for i in range(tp)]
    return "|".join(",".join(str(core[-1]) for core in rank) for rank in ranks)


def _set_threads(proc: psutil.Process, cpus: Iterable[int]) -> int:
    """Set the affinity of every thread of ``proc``; return how many were set (threads that end meanwhile
    are skipped)."""
    n, mask = 0, set(cpus)
    for thread in proc.threads():
        try:
            os.sched_setaffinity(thread.id, mask)
            n += 1
        except (ProcessLookupError, PermissionError):
            continue
    return n


def is_engine_core(proc: psutil.Process) -> bool:
    """Whether ``proc`` is vLLM's engine core: it names itself ``VLLM::EngineCore`` (with setproctitle), or,
    without that name, it is the multiprocessing child the API server spawns (``spawn_main``)."""
    try:
        cmdline = " ".join(proc.cmdline())
        return "EngineCore" in proc.name() or "EngineCore" in cmdline or "spawn_main" in cmdline
    except psutil.Error:
        return False


def apply(server_pid: int, placement: Plan | frozenset[int]) -> dict[str, int]:
    """Pin every thread of the server ``server_pid`` and its descendants, and of this process (the client):
    by role for a :class:`Plan`, or all to one CPU set (e.g. this host's CPUs: the OS places them again).
    Returns the number of threads set per role. Raises :class:`ValueError` if a plan is given and no engine
    core is found among the server's processes."""
    root = psutil.Process(server_pid)
    procs = [root, *root.children(recursive=True)]
    role = {p.pid: ("engine" if is_engine_core(p) else "api") for p in procs}
    if isinstance(placement, Plan) and "engine" not in role.values():
        raise ValueError(f"no vLLM engine core among the server's processes {sorted(role)}: cannot pin by role")
    cpus: Mapping[str, Iterable[int]] = placement.as_dict() if isinstance(placement, Plan) else \
        dict.fromkeys(ROLES, placement)  # fmt: skip
    counts = dict.fromkeys(ROLES, 0)
    for p in procs:
        try:
            counts[role[p.pid]] += _set_threads(p, cpus[role[p.pid]])
        except psutil.NoSuchProcess:
            continue
    counts["client"] = _set_threads(psutil.Process(), cpus["client"])
    return counts
