"""GPU slot locking: pool parsing, disjoint allocations, timeouts, contention across processes."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import types
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slmserve import gpuslots
from slmserve.gpuslots import (
    Allocation,
    GpuPoolTooSmall,
    GpuSlots,
    GpuSlotTimeout,
    NoGpuError,
    default_lock_dir,
    gpu_pool,
    lock_path,
    nvml_indices,
    who_holds,
)


def fake_env(tmp_path: Path, pool: str) -> dict[str, str]:
    return {"SLMSERVE_GPU_POOL": pool, "SLMSERVE_LOCK_DIR": str(tmp_path / "locks")}


def sub_env(tmp_path: Path, pool: str) -> dict[str, str]:
    return {**os.environ, **fake_env(tmp_path, pool)}


# A contender: waits at a start barrier so that all contenders really compete, takes k slots, records
# (pid, ids, t_enter, t_exit) while holding them, releases.
WORKER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from slmserve.gpuslots import GpuSlots

    k, hold, out, barrier = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    (barrier / f"ready-{os.getpid()}").touch()
    while not (barrier / "go").exists():
        time.sleep(0.005)
    with GpuSlots(k, label=f"worker-{os.getpid()}", timeout_s=30, poll_s=0.01) as alloc:
        t_enter = time.monotonic()
        time.sleep(hold)
        t_exit = time.monotonic()
        line = f"{os.getpid()} {','.join(alloc.ids)} {t_enter!r} {t_exit!r}\\n"
        fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, line.encode())
        os.close(fd)
    """
)

# Holds k slots until killed; says "held" once it holds them.
HOLDER = textwrap.dedent(
    """
    import sys, time
    from slmserve.gpuslots import GpuSlots

    with GpuSlots(int(sys.argv[1]), label="holder", timeout_s=10, poll_s=0.01) as alloc:
        print("held", ",".join(alloc.ids), flush=True)
        time.sleep(60)
    """
)


def run_contenders(tmp_path: Path, pool: str, n: int, k: int, hold: float) -> list[tuple[int, set[str], float, float]]:
    out = tmp_path / "intervals.txt"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = sub_env(tmp_path, pool)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(k), str(hold), str(out), str(barrier)],
            env=env,
            stderr=subprocess.PIPE,
        )
        for _ in range(n)
    ]
    try:
        deadline = time.monotonic() + 20
        while len(list(barrier.glob("ready-*"))) < n:
            assert time.monotonic() < deadline, "contenders did not start"
            assert all(p.poll() is None for p in procs), [p.stderr.read() for p in procs if p.poll()]
            time.sleep(0.01)
        (barrier / "go").touch()
        for p in procs:
            _, err = p.communicate(timeout=30)
            assert p.returncode == 0, err.decode()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    rows = []
    for line in out.read_text().splitlines():
        pid, ids, t0, t1 = line.split()
        rows.append((int(pid), set(ids.split(",")), float(t0), float(t1)))
    return rows


@pytest.fixture
def holder(tmp_path: Path):
    """Start a subprocess holding k slots of a fake pool; yields it once it holds them."""
    procs: list[subprocess.Popen] = []

    def start(pool: str, k: int = 1) -> tuple[subprocess.Popen, list[str]]:
        p = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(k)],
            env=sub_env(tmp_path, pool),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(p)
        line = p.stdout.readline().split()
        assert line and line[0] == "held", p.stderr.read() if p.poll() is not None else line
        return p, line[1].split(",")

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


# ------------------------------------------------------------------------------------------- pool


def test_pool_from_cuda_visible_devices() -> None:
    assert gpu_pool({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert gpu_pool({"CUDA_VISIBLE_DEVICES": " 2 , 3 ,"}) == ["2", "3"]
    assert gpu_pool({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert gpu_pool({"CUDA_VISIBLE_DEVICES": "-1"}) == []
    assert gpu_pool({"CUDA_VISIBLE_DEVICES": "1,-1,2"}) == ["1"]  # CUDA stops at an invalid entry
    assert gpu_pool({"CUDA_VISIBLE_DEVICES": "1,1,0"}) == ["1", "0"]


def test_pool_keeps_uuids_as_strings() -> None:
    cvd = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6,MIG-4b9a1e3c-55d2-5b0e-a2f0-6f3b4c2a1d0e"
    assert gpu_pool({"CUDA_VISIBLE_DEVICES": cvd}) == cvd.split(",")


def test_pool_override_wins() -> None:
    env = {"SLMSERVE_GPU_POOL": "a,b,c", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert gpu_pool(env) == ["a", "b", "c"]
    assert gpu_pool({"SLMSERVE_GPU_POOL": "", "CUDA_VISIBLE_DEVICES": "2,3"}) == []


class FakeNvml(types.SimpleNamespace):
    """Two GPUs; GPU 1 carries one MIG instance."""

    UUIDS = ("GPU-aaaa-0000", "GPU-bbbb-1111")
    MIG = "MIG-cccc-2222"

    def __init__(self, fail_init: bool = False) -> None:
        super().__init__(fail_init=fail_init, inits=0, shutdowns=0)

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> tuple[str, int]:
        return ("gpu", i)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> tuple[str, int]:
        if uuid in self.UUIDS:
            return ("gpu", self.UUIDS.index(uuid))
        if uuid == self.MIG:
            return ("mig", 1)
        raise RuntimeError("NVML_ERROR_NOT_FOUND")

    def nvmlDeviceIsMigDeviceHandle(self, handle: tuple[str, int]) -> bool:
        return handle[0] == "mig"

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: tuple[str, int]) -> tuple[str, int]:
        return ("gpu", handle[1])

    def nvmlDeviceGetIndex(self, handle: tuple[str, int]) -> int:
        assert handle[0] == "gpu", "NVML has no index for a MIG handle"
        return handle[1]

    def nvmlDeviceGetUUID(self, handle: tuple[str, int]) -> bytes:
        return self.UUIDS[handle[1]].encode()


def test_pool_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert gpu_pool({}) == ["0", "1"]
    assert fake.inits == fake.shutdowns == 1


def test_pool_empty_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert gpu_pool({}) == []
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(fail_init=True))
    assert gpu_pool({}) == []


def test_nvml_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    assert nvml_indices(["3", "1"]) == (3, 1)
    assert nvml_indices(["GPU-bbbb-1111", "GPU-aaaa-0000"]) == (1, 0)
    assert nvml_indices(["MIG-cccc-2222"]) == (1,)  # a MIG instance reports its parent GPU
    assert nvml_indices(["GPU-bbbb"]) == (1,)  # a UUID prefix, as CUDA accepts it
    assert nvml_indices(["MIG-GPU-aaaa-0000/1/0"]) == (0,)  # old-style MIG id
    assert nvml_indices(["GPU-dead", "0"]) == (0,)  # unknown ids are left out
    assert nvml_indices(["MIG-cccc-2222", "GPU-bbbb-1111"]) == (1,)  # no duplicates
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert nvml_indices(["GPU-aaaa-0000", "2"]) == (2,)


def test_allocation_env() -> None:
    assert Allocation(("2", "3"), (2, 3)).env() == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert Allocation(("GPU-x",), ()).env() == {"CUDA_VISIBLE_DEVICES": "GPU-x"}
    cpu = Allocation((), ())
    assert cpu.env() == {}
    assert cpu.is_cpu


def test_default_lock_dir() -> None:
    uid = os.getuid()
    assert default_lock_dir({}) == Path(f"/tmp/slmserve-gpu-locks-{uid}")
    assert default_lock_dir({"SLURM_JOB_ID": "42"}) == Path(f"/tmp/slmserve-gpu-locks-{uid}-slurm42")
    assert default_lock_dir({"SLMSERVE_LOCK_DIR": "/x/y", "SLURM_JOB_ID": "42"}) == Path("/x/y")


def test_lock_path_sanitised_and_unique(tmp_path: Path) -> None:
    assert lock_path("0", tmp_path) == tmp_path / "gpu-0.lock"
    assert lock_path("GPU-8932f937-d72c", tmp_path) == tmp_path / "gpu-GPU-8932f937-d72c.lock"
    odd = lock_path("MIG-GPU-abc/1/0", tmp_path)
    assert odd.parent == tmp_path and "/" not in odd.name
    assert odd != lock_path("MIG-GPU-abc_1_0", tmp_path)
    assert lock_path("..", tmp_path).parent == tmp_path and lock_path("..", tmp_path).name != "gpu-...lock"


# -------------------------------------------------------------------------------------- in-process


def test_disjoint_allocations_and_release(tmp_path: Path) -> None:
    env = fake_env(tmp_path, "0,1,2")
    a = GpuSlots(2, label="a", env=env, timeout_s=0)
    b = GpuSlots(1, label="b", env=env, timeout_s=0)
    alloc_a = a.acquire()
    alloc_b = b.acquire()
    assert alloc_a.ids == ("0", "1") and alloc_a.nvml_indices == (0, 1)
    assert alloc_b.ids == ("2",)
    assert who_holds("0", env=env)["label"] == "a"
    holder = who_holds("2", env=env)
    assert holder == {"pid": os.getpid(), "host": socket.gethostname(), "label": "b", "since": holder["since"],
                      "gpu": "2"}  # fmt: skip
    since = datetime.fromisoformat(holder["since"])
    assert abs((datetime.now(UTC) - since).total_seconds()) < 60  # when this process took it
    with pytest.raises(GpuSlotTimeout):
        GpuSlots(1, env=env, timeout_s=0).acquire()
    a.release()
    assert who_holds("0", env=env) is None and who_holds("1", env=env) is None
    assert (tmp_path / "locks" / "gpu-0.lock").read_text() == ""  # holder info cleared on release
    with GpuSlots(2, env=env, timeout_s=0) as alloc_c:
        assert alloc_c.ids == ("0", "1")
    b.release()
    b.release()  # idempotent
    with GpuSlots(3, env=env, timeout_s=0) as alloc_d:
        assert alloc_d.ids == ("0", "1", "2")
    assert who_holds("5", env=env) is None  # never locked: no file


def test_acquire_twice_is_an_error(tmp_path: Path) -> None:
    slots = GpuSlots(1, env=fake_env(tmp_path, "0,1"), timeout_s=0)
    with slots, pytest.raises(RuntimeError, match="already holds"):
        slots.acquire()


def test_k_larger_than_pool(tmp_path: Path) -> None:
    with pytest.raises(GpuPoolTooSmall) as err:
        GpuSlots(3, env=fake_env(tmp_path, "0,1"), timeout_s=0).acquire()
    msg = str(err.value)
    assert "3 GPU(s) requested" in msg and "['0', '1']" in msg
    assert "--resources gpu=N" in msg and "CUDA_VISIBLE_DEVICES" in msg


def test_k_zero_and_cpu_fallback(tmp_path: Path) -> None:
    with GpuSlots(0, env=fake_env(tmp_path, "0")) as alloc:
        assert alloc == Allocation((), ())
    assert not (tmp_path / "locks").exists()  # no lock touched
    cpu_env = {"CUDA_VISIBLE_DEVICES": "", "SLMSERVE_LOCK_DIR": str(tmp_path / "locks")}
    with GpuSlots(1, env=cpu_env, allow_cpu=True) as alloc:
        assert alloc.ids == () and alloc.env() == {}
    with pytest.raises(NoGpuError, match="pool is empty"):
        GpuSlots(1, env=cpu_env, allow_cpu=False).acquire()


def test_dropped_gpuslots_releases(tmp_path: Path) -> None:
    env = fake_env(tmp_path, "0")
    GpuSlots(1, env=env, timeout_s=0).acquire()  # never released explicitly: garbage
    import gc

    gc.collect()
    with GpuSlots(1, env=env, timeout_s=0) as alloc:
        assert alloc.ids == ("0",)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        GpuSlots(-1)
    with pytest.raises(ValueError):
        GpuSlots(1, poll_s=0)
    with pytest.raises(ValueError):
        GpuSlots(1, timeout_s=-1)


# ------------------------------------------------------------------------------------ across processes


def test_timeout_when_held_by_another_process(tmp_path: Path, holder, caplog) -> None:
    proc, ids = holder("0")
    assert ids == ["0"]
    env = fake_env(tmp_path, "0")
    info = who_holds("0", env=env)
    assert info["pid"] == proc.pid and info["label"] == "holder" and info["gpu"] == "0"
    caplog.set_level(logging.INFO, logger=gpuslots.__name__)
    t0 = time.monotonic()
    with pytest.raises(GpuSlotTimeout) as err:
        GpuSlots(1, label="late", env=env, timeout_s=0.5, poll_s=0.05).acquire()
    elapsed = time.monotonic() - t0
    assert 0.5 <= elapsed < 3
    msg = str(err.value)
    assert "within 0.5 s" in msg and f"pid {proc.pid}" in msg and "(holder)" in msg
    assert any("waiting for 1 GPU slot" in r.getMessage() for r in caplog.records)
    assert isinstance(err.value, TimeoutError)


def test_killed_holder_frees_its_slot(tmp_path: Path, holder) -> None:
    proc, _ = holder("0")
    env = fake_env(tmp_path, "0")
    with pytest.raises(GpuSlotTimeout):
        GpuSlots(1, env=env, timeout_s=0).acquire()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5)
    with GpuSlots(1, label="next", env=env, timeout_s=2, poll_s=0.01) as alloc:
        assert alloc.ids == ("0",)
        assert who_holds("0", env=env)["label"] == "next"  # stale holder info overwritten


def test_lock_fds_not_inherited_by_children(tmp_path: Path) -> None:
    env = fake_env(tmp_path, "0")
    slots = GpuSlots(1, env=env, timeout_s=0)
    slots.acquire()
    assert slots._fds and not any(os.get_inheritable(fd) for fd in slots._fds)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], close_fds=False)
    try:
        slots.release()
        # The child (alive for 30 s) must not keep the lock. A short timeout, not 0: between fork and
        # exec a child does share the lock, and the kernel may finish closing it just after Popen
        # returns (microseconds).
        with GpuSlots(1, env=env, timeout_s=2, poll_s=0.01) as alloc:
            assert alloc.ids == ("0",)
    finally:
        child.kill()
        child.wait()


def test_contention_8_processes_2_slots(tmp_path: Path) -> None:
    rows = run_contenders(tmp_path, "0,1", n=8, k=1, hold=0.25)
    assert len(rows) == 8 and len({pid for pid, *_ in rows}) == 8  # all 8 ran
    assert all(len(ids) == 1 for _, ids, _, _ in rows)
    used = {next(iter(ids)) for _, ids, _, _ in rows}
    assert used == {"0", "1"}  # both slots used
    for gpu in used:
        intervals = sorted((t0, t1) for _, ids, t0, t1 in rows if gpu in ids)
        for (_, prev_exit), (next_enter, _) in itertools.pairwise(intervals):
            assert next_enter >= prev_exit, f"GPU {gpu} held twice at once: {intervals}"
    # with 2 slots, at most 2 holders at any instant, so 8 holds of 0.25 s need at least 1 s
    span = max(t1 for *_, t1 in rows) - min(t0 for *_, t0, _ in rows)
    assert span >= 4 * 0.25


def test_contention_k2_on_pool_of_3(tmp_path: Path) -> None:
    rows = run_contenders(tmp_path, "0,1,2", n=4, k=2, hold=0.2)
    assert len(rows) == 4
    assert all(len(ids) == 2 and ids <= {"0", "1", "2"} for _, ids, _, _ in rows)
    for i, (_, ids_a, a0, a1) in enumerate(rows):
        for _, ids_b, b0, b1 in rows[i + 1 :]:
            if a0 < b1 and b0 < a1:  # held at the same time
                assert not ids_a & ids_b, f"{ids_a} and {ids_b} overlap in time and share a GPU"
