"""Replicas without the engine: MPS's daemon driven through a stand-in control binary (named as such),
replicas started together (stand-in servers from test_server), their KV-cache bytes, and MPS recorded
as unsupported where there is no GPU."""

from __future__ import annotations

import contextlib
import stat
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

from slmserve import dataset, io, mps, replication
from slmserve.runner import SweepJob
from slmserve.server import InfeasibleError, VllmServer
from tests.test_server import gone, pids_of, stand_in  # noqa: F401  (stand_in is a fixture)

# A stand-in for nvidia-cuda-mps-control: "-f" logs its start, opens the control socket (a file) and runs
# until a "quit" command; "-d" does the same in a detached grandchild, as the real daemon leaves itself to init
# (STAND_IN_MPS_FAIL makes both fail). The daemon writes its pid to <log>.pid. Stdin commands are logged with
# the environment the daemon would have; get_server_list prints a pid.
STAND_IN_CONTROL = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    import os, sys, time
    log = open(os.environ["STAND_IN_MPS_LOG"], "a", buffering=1)
    pipe, logdir, cvd = (os.environ.get(k) for k in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY",
                                                       "CUDA_VISIBLE_DEVICES"))

    def serve():
        open(os.environ["STAND_IN_MPS_LOG"] + ".pid", "w").write(str(os.getpid()))
        open(os.path.join(pipe, "control"), "w").close()
        deadline = time.monotonic() + 60  # a stand-in never outlives the test for long
        while not os.path.exists(os.path.join(pipe, "quit")) and time.monotonic() < deadline:
            time.sleep(0.05)

    if sys.argv[1:] in (["-d"], ["-f"]):
        log.write(f"start {pipe} {logdir} {cvd}\\n")
        if os.environ.get("STAND_IN_MPS_FAIL"):
            print("An instance of this daemon is already running", file=sys.stderr); sys.exit(1)
        if sys.argv[1:] == ["-f"]:
            serve(); sys.exit(0)
        if os.fork() == 0:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)  # as a daemon does: the caller's pipes close
            if os.fork() == 0:
                serve()
            os._exit(0)
        sys.exit(0)
    cmd = sys.stdin.read().strip()
    log.write(f"{cmd} {pipe}\\n")
    if cmd == "quit":
        open(os.path.join(pipe, "quit"), "w").close()
    if cmd == "get_server_list" and not os.environ.get("STAND_IN_MPS_NOSERVER"):
        print(4242)
    """
)


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    binary = tmp_path / "stand_in_mps_control"
    binary.write_text(STAND_IN_CONTROL.replace("#!/usr/bin/env python3", f"#!{sys.executable}", 1))
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(mps.CONTROL_ENV, str(binary))
    log = tmp_path / "control.log"
    monkeypatch.setenv("STAND_IN_MPS_LOG", str(log))
    return log


def test_daemon_is_private_and_quit_on_the_way_out(tmp_path: Path, control: Path) -> None:
    with mps.Daemon(["3"], tmp_path / "mps-logs") as daemon:
        env = daemon.env()
        pipe = Path(env["CUDA_MPS_PIPE_DIRECTORY"])
        assert pipe.is_dir() and env["CUDA_VISIBLE_DEVICES"] == "3" and (tmp_path / "mps-logs").is_dir()
        assert daemon.check_server() == [4242]
    assert control.read_text().splitlines() == [f"start {pipe} {tmp_path / 'mps-logs'} 3",
                                                f"get_server_list {pipe}", f"quit {pipe}"]  # fmt: skip
    assert not pipe.exists()  # its pipe directory goes with it


def test_daemon_quits_when_the_job_fails(tmp_path: Path, control: Path) -> None:
    with pytest.raises(RuntimeError, match="replica died"), mps.Daemon(["0"], tmp_path / "logs"):
        raise RuntimeError("replica died")
    assert control.read_text().splitlines()[-1].startswith("quit ")


def test_daemon_errors_name_the_cause(tmp_path: Path, control: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAND_IN_MPS_FAIL", "1")
    with pytest.raises(mps.MpsError, match="exited with 1: An instance of this daemon is already running"):
        mps.Daemon(["0"], tmp_path / "logs").__enter__()
    assert not [ln for ln in control.read_text().splitlines() if ln.startswith("quit")]  # never started
    monkeypatch.delenv("STAND_IN_MPS_FAIL")
    monkeypatch.setenv("STAND_IN_MPS_NOSERVER", "1")
    with mps.Daemon(["0"], tmp_path / "logs") as daemon, pytest.raises(mps.MpsError, match="no nvidia-cuda-mps-server"):
        daemon.check_server()


def test_where_mps_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "CPU engine" in (mps.unavailable([]) or "")
    monkeypatch.setenv(mps.CONTROL_ENV, str(tmp_path / "missing"))
    assert "MPS control daemon not found" in (mps.unavailable(["0"]) or "")
    with pytest.raises(mps.MpsError, match="not found"):
        mps.Daemon(["0"], tmp_path)


def test_mps_without_a_gpu_is_recorded_as_unsupported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = _cpu_job(tmp_path, monkeypatch)
    out = tmp_path / "opt125m_r2.parquet"
    meta = replication.run_replication(job, 2, 8, out, use_mps=True)
    assert meta["status"] == "unsupported" and "MPS needs a GPU" in meta["reason"]
    (row,) = replication.summarize_repeats(out)
    assert (row["status"], row["mps"], row["start"], row["replicas"]) == ("unsupported", True, "sequential", 2)
    assert row["plan"] == "equal"
    with pytest.raises(ValueError, match="replication start 'parallel': allowed values are sequential, together"):
        replication.run_replication(job, 2, 8, out, start="parallel")
    assert io.read_meta(out)["run"]["batch_per_replica"] == 4  # the one-GPU maximum 8 split evenly
    assert io.read_meta(out)["run"]["batch_rule"] == "one-GPU maximum / replicas"
    replication.run_replication(job, 2, 8, out, use_mps=True, batch=3)  # a plan's own batch
    assert (io.read_meta(out)["run"]["batch_per_replica"], io.read_meta(out)["run"]["batch_rule"]) == (3, "given")
    with pytest.raises(ValueError, match="replication batch 0: a replica's batch must be at least 1"):
        replication.run_replication(job, 2, 8, out, batch=0)


def test_the_advisors_plan_from_its_table() -> None:
    table = pl.DataFrame({"model": ["opt125m", "opt1.3b", "opt2.7b", "opt6.7b"],
                          "chosen_batch": [256, 256, 128, None], "replicas_fit": [10, 1, 0, None],
                          "note": [None, None, None, "no batch reaches 95%"]})  # fmt: skip
    assert replication.advisor_plan(table, "opt125m", 4) == replication.AdvisorPlan(4, 256)  # capped
    assert replication.advisor_plan(table, "opt125m", 12) == replication.AdvisorPlan(10, 256)
    assert replication.advisor_plan(table, "opt1.3b", 4) == replication.AdvisorPlan(1, 256)
    assert replication.advisor_plan(table, "opt2.7b", 4) == replication.AdvisorPlan(1, 128)  # none fits: one
    none = replication.advisor_plan(table, "opt6.7b", 4)
    assert none.replicas is None and "chose no batch for opt6.7b (no batch reaches 95%)" in (none.why or "")
    assert "advisor.csv has no row for opt13b" in (replication.advisor_plan(table, "opt13b", 4).why or "")
    with pytest.raises(ValueError, match=r"x\.csv: no column replicas_fit; rebuild it with the advisor rule"):
        replication.advisor_plan(table.drop("replicas_fit"), "opt125m", 4, "x.csv")


def test_an_advisor_plan_is_run_or_recorded_with_its_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No plan: the result says why (infeasible, no server); a plan under MPS without a GPU: unsupported, with
    the plan's replicas and batch recorded; both summarized as the advisor's plan."""
    job = _cpu_job(tmp_path, monkeypatch)
    none, out = tmp_path / "opt125m_advisor-plain.parquet", tmp_path / "opt125m_advisor-mps.parquet"
    why = "the advisor chose no batch"
    monkeypatch.setenv("SLMSERVE_GPU_POOL", "7")  # the job's GPU, recorded though no server starts
    meta = replication.run_advisor_plan(job, replication.AdvisorPlan(None, None, why), 8, none)
    assert (meta["status"], meta["reason"], meta["run"]["plan"]) == ("infeasible", why, "advisor")
    assert meta["gpu_ids"] == ["7"]
    monkeypatch.setenv("SLMSERVE_GPU_POOL", "")
    meta = replication.run_advisor_plan(job, replication.AdvisorPlan(4, 3), 8, out, use_mps=True)
    assert meta["status"] == "unsupported" and "MPS needs a GPU" in meta["reason"]
    # the setting that controls a plan's MPS (experiments.replication.mps does not)
    assert meta["reason"].endswith("set experiments.replication.advisor_plan.variants without mps")
    assert (meta["run"]["replicas"], meta["run"]["batch_per_replica"], meta["run"]["batch_rule"]) == (4, 3, "advisor")
    rows = replication.summarize_runs([none, out])
    assert rows.select("plan", "mps", "replicas", "status").rows() == [
        ("advisor", True, 4, "unsupported"), ("advisor", False, None, "infeasible")]  # fmt: skip
    with pytest.raises(ValueError, match="replication plan 'equal' with batch 3: allowed plans are"):
        replication.run_replication(job, 2, 8, out, batch=3, plan="equal")


def _cpu_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SweepJob:
    """A replication job on this machine (no GPU), with two prompts."""
    monkeypatch.setenv("SLMSERVE_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("SLMSERVE_GPU_POOL", "")
    prompts = tmp_path / "prompts.parquet"
    rows = {"request_id": [0, 1], "source_id": ["a", "b"], "source_index": [0, 1], "original_len": [9, 9],
            "prompt_len": [4, 4], "token_ids": [[1, 2, 3, 4]] * 2, "tokenizer": ["t"] * 2}  # fmt: skip
    io.write_parquet(pl.DataFrame(rows, schema=dataset.SCHEMA), prompts, {})
    return SweepJob(model="opt125m", model_path="config/models/opt-125m", load_format="dummy", tensor_parallel=1,
                    batch_sizes=[], prompts_path=prompts, outputs={}, log_dir=tmp_path, input_len=4, output_len=4,
                    num_requests=2, telemetry_enabled=False)  # fmt: skip


def test_replica_kv_bytes_leave_out_what_one_server_holds_besides_its_cache() -> None:
    probe = {"gpu_memory_utilization": 0.9, "kv_cache_tokens": 373_008}  # OPT-1.3B, whole H100
    total, per_token = 85e9, 196_608  # 24 layers x 2 x 2048 x fp16
    used = 0.9 * total - 373_008 * per_token  # weights, activations, context, graphs
    kv = replication.replica_kv_bytes(probe, 0.45, total, per_token)
    assert kv == int(0.45 * total - used)
    assert replication.replica_kv_bytes(probe, 0.9, total, per_token) == pytest.approx(373_008 * per_token, abs=1)
    with pytest.raises(InfeasibleError, match="leaves no KV cache"):
        replication.replica_kv_bytes(probe, 0.03, total, per_token)  # 2.55 GB < the 3.16 GB besides the cache


def test_replicas_started_together_launch_before_any_is_ready(stand_in, tmp_path: Path) -> None:  # noqa: F811
    specs = []
    for i in range(2):
        spec, pids = stand_in("serve")
        spec.env = {**spec.env, "STAND_IN_PIDS": str(tmp_path / f"pids-{i}")}
        specs.append(spec)
    with contextlib.ExitStack() as stack:
        servers = replication.start_replicas(stack, specs, together=True)
        assert all(isinstance(s, VllmServer) and s.alive() and s.kv_cache_tokens == 1234 * 16 for s in servers)
        pids = [pids_of(tmp_path / f"pids-{i}") for i in range(2)]
        # both processes were launched before the first one was waited for
        assert servers[1].launched_at <= servers[0].launched_at + servers[0].startup_s
    assert all(gone(p) for group in pids for p in group)


def test_a_refused_replica_is_named_and_the_others_stop(stand_in, tmp_path: Path) -> None:  # noqa: F811
    ok, ok_pids = stand_in("serve")
    refused, _ = stand_in("nomem")
    for together in (True, False):
        with pytest.raises(InfeasibleError) as err, contextlib.ExitStack() as stack:
            replication.start_replicas(stack, [ok, refused], together=together)
        assert err.value.reason.startswith("replica 1: ValueError: No available memory")
        assert all(gone(p) for p in pids_of(ok_pids))


def test_a_replication_summary_names_the_gpus_its_run_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its ``gpu_ids`` column, as a sweep's: the ids the job held (a fake pool of GPU 1 here, where MPS then
    has no control binary, so the run is recorded as unsupported with those ids)."""
    job = _cpu_job(tmp_path, monkeypatch)
    monkeypatch.setenv("SLMSERVE_GPU_POOL", "1")
    monkeypatch.setenv(mps.CONTROL_ENV, str(tmp_path / "no-such-control"))
    out = tmp_path / "opt125m_r2.parquet"
    assert replication.run_replication(job, 2, 8, out, use_mps=True)["status"] == "unsupported"
    (row,) = replication.summarize_repeats(out)
    assert row["gpu_ids"] == "1"
    assert replication.summarize_runs([out])["gpu_ids"].to_list() == ["1"]


def test_a_replica_without_a_count_makes_the_runs_sum_unknown() -> None:
    count = "vllm:num_preemptions_total"
    assert replication._preemptions({"server_counters": [{count: 2.0}, {count: 3.0}]}) == 5.0
    assert replication._preemptions({"server_counters": [{count: 2.0}, None]}) is None  # a failed /metrics read
    assert replication._preemptions({"server_counters": [{count: 2.0}, {}]}) is None
    # the effective batch likewise: a replica without one leaves the sum unknown, not counted as 0
    a, b = {"effective_batch": 40.0, "gauge_samples": 9}, {"effective_batch": 2.5, "gauge_samples": 7}
    assert replication._effective_batch({"engine": [a, b]}) == {"effective_batch": 42.5, "gauge_samples": 7}
    unknown = {"effective_batch": None, "gauge_samples": None}
    assert replication._effective_batch({"engine": [a, {"effective_batch": None, "gauge_samples": 0}]}) == {
        "effective_batch": None, "gauge_samples": 0}  # fmt: skip
    assert replication._effective_batch({"engine": [a, None]}) == unknown
    assert replication._effective_batch({}) == unknown
