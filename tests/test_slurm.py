"""The workflow on a real SLURM: the smoke DAG submitted through profiles/slurm.

``tests/slurm/start_slurm.sh`` brings up a one-node SLURM from Debian's packages (munge, MariaDB,
slurmdbd, slurmctld, slurmd; installed if missing) with 4 GPUs that are not there: their device files
are aliases of /dev/null, so ``--gpus=k`` is accepted and SLURM sets CUDA_VISIBLE_DEVICES, while the
jobs run the CPU engine. The test submits ``snakemake demo`` with the smoke configuration through a copy
of profiles/slurm in which only the partition and account are changed and the GPU jobs' CPUs, memory
and time are scaled to this machine (engine.batch_control=client: one server start per sweep job;
workload.repeats=1: the SLURM path needs no second repeat; both keep the test to a few minutes). A blocker
job holds GPU 0 throughout, so the sweep job is given another GPU and must use that one. Then:

1. once the sweep job's vLLM server answers, the job is scancel'ed: no process of that job (the server
   included) may be left after 30 s (SLURM's KillWait), and Snakemake must report the job failed;
2. Snakemake is run again with the same command: it must finish, every sweep output must carry the
   SLURM job id that made it, that job must be COMPLETED in sacct with one GPU, the GPU ids the job
   used must be the ones SLURM allocated, the parquet schemas must be those a local run writes, and the
   summary must equal the one computed here from the same runs.

Needs root and apt-get (or the packages installed): otherwise, or when SLURM does not start, the test
is skipped with the reason (and the daemons' log tails); it never passes without running.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import polars as pl
import psutil
import pytest
import yaml
from polars.testing import assert_frame_equal

from slmserve import analysis, io, layout, measure, provenance
from tests.conftest import ROOT, SNAKEMAKE, requires_engine

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.engine, requires_engine]

SCRIPTS = ROOT / "tests" / "slurm"
FIXTURE_RUNS = ROOT / "tests/fixtures/results/runs/opt125m/tp1-out16-rateinf"  # a local run of the smoke DAG
SLURM_DIR = Path(os.environ.get("SLMSERVE_SLURM_DIR", "/tmp/slmserve-slurm"))
PARTITION, ACCOUNT = "debug", "slmtest"  # what start_slurm.sh creates
KILL_WAIT_S = 30  # KillWait in start_slurm.sh's slurm.conf: SIGKILL this long after SIGTERM


def gpu_rules() -> tuple[str, ...]:
    """The workflow's rules that declare a ``gpu`` resource: each needs its entry in the profile's set-resources."""
    found = []
    for smk in [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))]:
        for m in re.finditer(r"^rule (\w+):\n((?:[ \t].*\n|\n)*)", smk.read_text(), re.M):
            if re.search(r"^    resources:\n(?:        .*\n)*?        gpu\s*=", m.group(2), re.M):
                found.append(m.group(1))
    return tuple(found)


GPU_RULES = gpu_rules()  # from the workflow: a GPU rule added there is checked here without a list to update


def _tail(text: str, n: int = 60) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


QUERY_PATIENCE_S = 60  # how long a repeatable command keeps retrying a failure


def _run(env: dict[str, str], *cmd: str, once: bool = False) -> str:
    """Run a SLURM client command. One that may be repeated safely (all but sbatch: ``once``) is retried on
    any failure for up to QUERY_PATIENCE_S: on 2 cores busy with vLLM, slurmctld drops connections, and a
    client then exits non-zero with a socket error or, as squeue 22.05 once did in CI, with no message."""
    deadline = time.monotonic() + QUERY_PATIENCE_S
    while True:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        if proc.returncode == 0:
            return proc.stdout
        err = proc.stderr.strip() or proc.stdout.strip() or "(no output)"
        if once or time.monotonic() > deadline:
            log = SLURM_DIR / "log" / "slurmctld.log"
            ctld = _tail(log.read_text(errors="replace"), 20) if log.exists() else "(no slurmctld.log)"
            raise AssertionError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {err}\nslurmctld.log:\n{ctld}")
        print(f"{cmd[0]}: exit {proc.returncode}, retrying: {err.splitlines()[0]}")
        time.sleep(2)


@pytest.fixture(scope="module")
def slurm() -> dict[str, str]:
    """A running single-node SLURM (started here, stopped at the end): the environment to reach it."""
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        pytest.skip("snakemake-executor-plugin-slurm is not installed in this environment")
    if os.geteuid() != 0:
        pytest.skip("the SLURM test needs root: it installs Debian packages and starts SLURM's daemons")
    env = {**os.environ, "SLMSERVE_SLURM_DIR": str(SLURM_DIR)}
    start = subprocess.run(
        ["bash", str(SCRIPTS / "start_slurm.sh")], env=env, capture_output=True, text=True, timeout=900
    )
    if start.returncode != 0:
        subprocess.run(["bash", str(SCRIPTS / "stop_slurm.sh")], env=env, capture_output=True, timeout=300)
        why = "this machine cannot run SLURM" if start.returncode == 2 else "SLURM did not start"
        pytest.skip(f"{why} (tests/slurm/start_slurm.sh exit {start.returncode}):\n{_tail(start.stderr)}")
    env["SLURM_CONF"] = str(SLURM_DIR / "etc" / "slurm.conf")
    try:
        yield env
    finally:
        stop = subprocess.run(
            ["bash", str(SCRIPTS / "stop_slurm.sh")], env=env, capture_output=True, text=True, timeout=300
        )
        print(stop.stderr)


# --- helpers -----------------------------------------------------------------------------------------


def slurm_test_profile(dest: Path, node_cpus: int) -> Path:
    """profiles/slurm with this cluster's partition and account, GPU jobs scaled to this node."""
    prof = yaml.safe_load((ROOT / "profiles/slurm/config.yaml").read_text())
    prof["default-resources"].update(slurm_partition=PARTITION, slurm_account=ACCOUNT)
    # a GPU rule without its entry would be submitted with the light jobs' one CPU and 30 minutes
    assert not [r for r in GPU_RULES if r not in prof["set-resources"]], (GPU_RULES, list(prof["set-resources"]))
    for rule in GPU_RULES:
        # the paper's sizes (8 CPUs per GPU, tens of GB, hours) do not fit a 2-core test node
        prof["set-resources"][rule].update(cpus_per_gpu=max(1, node_cpus - 1), mem_mb=6000, runtime=30)
    dest.mkdir(parents=True)
    (dest / "config.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
    return dest


def job_processes(job_id: str) -> list[psutil.Process]:
    """Live processes that belong to SLURM job ``job_id`` (their environment says so)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("SLURM_JOB_ID") == job_id:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def is_vllm(proc: psutil.Process) -> bool:
    try:
        return "vllm.entrypoints" in " ".join(proc.cmdline()) or proc.name().startswith("VLLM::")
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def alive(pids: set[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def squeue_jobs(env: dict[str, str]) -> list[tuple[str, str, str]]:
    """(job id, comment, state) of every job SLURM knows (the executor's comment is rule_<name>...)."""
    out = _run(env, "squeue", "-h", "-t", "all", "-o", "%i|%k|%T")
    return [tuple(line.split("|", 2)) for line in out.splitlines() if line.strip()]  # type: ignore[misc]


def sacct(env: dict[str, str], ids: list[str]) -> dict[str, dict[str, str]]:
    fields = ["JobIDRaw", "State", "Comment", "AllocTRES", "ExitCode"]
    out = _run(env, "sacct", "-X", "-n", "-P", "-j", ",".join(ids), "-o", ",".join(fields))
    rows = [dict(zip(fields, line.split("|"), strict=True)) for line in out.splitlines() if line.strip()]
    return {r["JobIDRaw"]: r for r in rows}


def allocated_gpus(env: dict[str, str], job_id: str) -> list[str] | None:
    """GPU indices SLURM gave a running job: ``GRES=gpu:1(IDX:1)`` or ``(IDX:0-1,3)`` in scontrol -d;
    None for a job without GPUs, or one that has ended (SLURM then no longer shows the indices)."""
    out = _run(env, "scontrol", "show", "job", "-d", job_id)
    m = re.search(r"GRES=gpu[^(]*\(IDX:([0-9,-]+)\)", out)
    if not m:
        return None
    ids: list[str] = []
    for part in m.group(1).split(","):
        lo, _, hi = part.partition("-")
        ids += [str(i) for i in range(int(lo), int(hi or lo) + 1)]
    return ids


def submitted(log: str) -> dict[str, str]:
    """SLURM job id -> rule, from Snakemake's "submitted with SLURM jobid N (log: .../rule_R/...)"."""
    pat = re.compile(r"submitted with SLURM jobid (\d+) \(log: \S*?/rule_([A-Za-z0-9_]+)/")
    return {m.group(1): m.group(2) for m in pat.finditer(log)}


def wait_for(what: str, probe, proc: subprocess.Popen, log: Path, timeout: float):
    """Poll ``probe()`` until it returns something truthy; fail if Snakemake exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        assert proc.poll() is None, f"snakemake exited ({proc.returncode}) before {what}:\n{_tail(log.read_text())}"
        time.sleep(1)
    raise AssertionError(f"no {what} after {timeout} s:\n{_tail(log.read_text())}")


def running_sweep_job(env: dict[str, str]) -> str | None:
    for job_id, comment, state in squeue_jobs(env):
        if comment.startswith("rule_sweep") and state == "RUNNING":
            return job_id
    return None


def answering_server(job_id: str) -> psutil.Process | None:
    """The job's vLLM API server once its /health answers 200."""
    for proc in job_processes(job_id):
        try:
            cmd = proc.cmdline()
        except psutil.Error:
            continue
        if "vllm.entrypoints.openai.api_server" not in " ".join(cmd) or "--port" not in cmd:
            continue
        port = cmd[cmd.index("--port") + 1]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return proc
        except OSError:
            pass
    return None


# --- the test ----------------------------------------------------------------------------------------


def test_smoke_dag_through_slurm_profile(slurm: dict[str, str], tmp_path: Path) -> None:
    env = slurm
    t_start = time.monotonic()
    node_cpus = int(_run(env, "sinfo", "-h", "-o", "%c").split()[0])
    # "devices": SLURM sets CUDA_VISIBLE_DEVICES; "plain" (no mknod here): it sets none, jobs see no GPU
    gpu_files = (SLURM_DIR / "etc" / "fake-gpu-files").read_text().strip()
    if gpu_files != "devices":
        print("the fake GPUs are plain files here: SLURM sets no CUDA_VISIBLE_DEVICES, jobs run GPU-less")
    out, fig, slurm_logs = tmp_path / "results", tmp_path / "figs", tmp_path / "slurm-logs"
    profile = slurm_test_profile(tmp_path / "profile", node_cpus)
    one_repeat = tmp_path / "one-repeat.yaml"  # --config would pass the nested 1 as a string
    one_repeat.write_text("workload:\n  repeats: 1\n")
    cmd = [
        SNAKEMAKE, "demo", "--workflow-profile", str(profile), "--configfile", "config/smoke.yaml", str(one_repeat),
        "--config", f"outdir={out}", f"figdir={fig}", "engine={batch_control: client}",
        "--slurm-init-seconds-before-status-checks", "5", "--slurm-logdir", str(slurm_logs),
    ]  # fmt: skip
    sweep_dir = out / "runs/opt125m/tp1-out16-rateinf"
    our_jobs: set[str] = set()

    # A job that holds GPU 0 all along: the sweep job must get, and use, another one.
    blocker = None
    if node_cpus >= 2:
        blocker = _run(
            env, "sbatch", "--parsable", "-p", PARTITION, "-A", ACCOUNT, "--gpus=1", "--cpus-per-gpu=1",
            "--mem=64", "-t", "30", "-J", "gpu-blocker", "-o", "/dev/null", "--wrap", "sleep 1800", once=True,
        ).strip()  # fmt: skip
        deadline = time.monotonic() + 60
        while not any(j == blocker and state == "RUNNING" for j, _, state in squeue_jobs(env)):
            assert time.monotonic() < deadline, f"the blocker job {blocker} did not start"
            time.sleep(0.5)
        blocked = allocated_gpus(env, blocker)
        assert blocked, f"the blocker job {blocker} has no GPU"
    else:
        blocked = []

    try:
        # ---- 1. submit; scancel the sweep job once its server answers -------------------------------
        log1 = tmp_path / "snakemake-1.log"
        with log1.open("w") as fh:
            smk = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, text=True)
        try:
            job_id = wait_for("running sweep job", lambda: running_sweep_job(env), smk, log1, 900)
            our_jobs.add(job_id)
            server = wait_for("vLLM server answering", lambda: answering_server(job_id), smk, log1, 900)
            gpus = allocated_gpus(env, job_id)
            assert gpus, f"SLURM allocated no GPU to the sweep job {job_id}"
            assert not set(gpus) & set(blocked), f"SLURM gave job {job_id} GPUs {gpus}, the blocker {blocked}"
            # the server runs inside the job, on the GPU SLURM allocated to it
            expect_cvd = ",".join(gpus) if gpu_files == "devices" else None
            assert server.environ().get("CUDA_VISIBLE_DEVICES") == expect_cvd
            procs = job_processes(job_id)
            vllm_pids = {p.pid for p in procs if is_vllm(p)} | {p.pid for p in server.children(recursive=True)}
            job_pids = {p.pid for p in procs}
            assert server.pid in vllm_pids

            t_cancel = time.monotonic()
            _run(env, "scancel", job_id)
            while alive(vllm_pids) and time.monotonic() - t_cancel < KILL_WAIT_S:
                time.sleep(0.2)
            vllm_gone_s = time.monotonic() - t_cancel
            assert alive(vllm_pids) == [], f"vLLM processes {alive(vllm_pids)} alive {KILL_WAIT_S} s after scancel"
            while (alive(job_pids) or job_processes(job_id)) and time.monotonic() - t_cancel < KILL_WAIT_S + 15:
                time.sleep(0.2)
            left = alive(job_pids) + [p.pid for p in job_processes(job_id)]
            assert left == [], f"processes of job {job_id} still alive after scancel: {left}"
            print(f"scancel {job_id}: vLLM gone after {vllm_gone_s:.1f} s")

            rc = smk.wait(timeout=300)  # the executor notices the cancelled job at its next status check
        finally:
            if smk.poll() is None:
                smk.send_signal(signal.SIGINT)
                try:
                    smk.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    smk.kill()
        text1 = log1.read_text()
        our_jobs |= set(submitted(text1))
        assert rc != 0, f"snakemake succeeded although its sweep job was cancelled:\n{_tail(text1)}"
        assert f"SLURM-job '{job_id}' failed, SLURM status is: 'CANCELLED'" in text1, _tail(text1)
        assert not list(sweep_dir.glob("*.parquet")), "a cancelled job left outputs behind"
        assert sacct(env, [job_id])[job_id]["State"].startswith("CANCELLED")

        # ---- 2. rerun: completes, cleanly -----------------------------------------------------------
        # (SLURM shows which GPUs a job holds only while it runs: note them as the jobs run)
        log2 = tmp_path / "snakemake-2.log"
        gpus_of: dict[str, list[str]] = {}
        with log2.open("w") as fh:
            smk = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 1200
            while smk.poll() is None and time.monotonic() < deadline:
                for jid, comment, state in squeue_jobs(env):
                    if comment.startswith("rule_") and state == "RUNNING" and jid not in gpus_of:
                        found = allocated_gpus(env, jid)
                        if found:
                            gpus_of[jid] = found
                time.sleep(1)
            rc = smk.wait(timeout=60)
        finally:
            if smk.poll() is None:
                smk.send_signal(signal.SIGINT)
                try:
                    smk.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    smk.kill()
        text2 = log2.read_text()
        jobs2 = submitted(text2)
        our_jobs |= set(jobs2)
        assert rc == 0, _tail(text2, 80)

        # every GPU-rule job ran as a SLURM job: its id in each output, COMPLETED in SLURM's records
        gpu_jobs = {j for j, rule in jobs2.items() if rule in GPU_RULES}
        assert gpu_jobs and {jobs2[j] for j in gpu_jobs} == {"sweep"}, jobs2
        runs = sorted(sweep_dir.glob("bs*.requests.parquet"), key=lambda p: int(p.name[2:].split(".")[0]))
        assert [p.name for p in runs] == [f"bs{b}.requests.parquet" for b in (1, 2, 4, 8)]
        records = sacct(env, sorted(gpu_jobs | {job_id}))
        for path in runs:
            meta = io.read_meta(path)
            prov = meta["provenance"]
            jid = prov["slurm_job_id"]
            assert jid is not None, f"{path.name}: no SLURM job id in the provenance"
            assert jid in gpu_jobs and jid != job_id, (jid, gpu_jobs)
            rec = records[jid]
            assert rec["State"] == "COMPLETED" and rec["ExitCode"] == "0:0", rec
            assert rec["Comment"].startswith("rule_sweep"), rec
            assert "gres/gpu=1" in rec["AllocTRES"], rec  # gpu=1 became sbatch --gpus=1
            # GPU pinning used exactly the GPUs SLURM allocated (never the blocker's); with plain-file fake
            # GPUs SLURM sets no CUDA_VISIBLE_DEVICES and there is nothing to pin (said at the start)
            if gpu_files == "devices":
                assert gpus_of.get(jid), f"no GPU seen allocated to SLURM job {jid}: {gpus_of}"
                assert meta["gpu_ids"] and meta["gpu_ids"] == gpus_of[jid], (meta["gpu_ids"], gpus_of, blocked)
                assert not set(meta["gpu_ids"]) & set(blocked)
            else:
                assert meta["gpu_ids"] == [], meta["gpu_ids"]
            assert meta["status"] == "ok"
            # the same schemas and provenance fields as a local run writes
            req = pl.read_parquet(path)
            tel = pl.read_parquet(layout.telemetry_path(path))
            assert req.schema == pl.Schema(measure.REQUESTS_SCHEMA)
            assert tel.schema == pl.Schema(measure.TELEMETRY_SCHEMA)
            assert req.height == 16 * len(meta["repeats"]) and (req["status"] == "ok").all()
            assert set(provenance.collect({})) <= set(prov)
            assert prov["engine"] == "vllm-cpu" and prov["hostname"]
        assert len({io.read_meta(p)["provenance"]["slurm_job_id"] for p in runs}) == 1  # one sweep job

        # the summary matches an independent local run of the same smoke DAG (the committed fixture, made by
        # tests/fixtures/make_fixtures.sh): same columns and types, points, statuses and request counts
        summary = pl.read_parquet(out / "summary/sweep.parquet")
        local = analysis.summarize_runs(sorted(str(p) for p in FIXTURE_RUNS.glob("bs*.requests.parquet")))
        assert set(summary.columns) == set(local.columns), set(summary.columns) ^ set(local.columns)
        keys = ["model", "tp", "batch_size", "output_len", "status", "n_ok"]
        assert_frame_equal(summary.select(keys), local.select(keys))
        assert (summary["throughput_rps"] > 0).all() and summary["path"].str.starts_with(str(out)).all()
        for ext in ("png", "svg", "html", "caption.md"):
            assert (fig / f"throughput_latency.{ext}").stat().st_size > 0

        print(f"SLURM jobs of the rerun: {jobs2}; the light rules not listed ran on the submit host")
        print(f"test wall time {time.monotonic() - t_start:.0f} s")
    finally:
        if blocker:
            subprocess.run(["scancel", blocker], env=env, capture_output=True, timeout=30)
        # no vLLM server of any of our jobs may be left
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(is_vllm(p) for j in our_jobs for p in job_processes(j)):
            time.sleep(0.5)
        leftovers = [p.pid for j in our_jobs for p in job_processes(j) if is_vllm(p)]
        for jid in our_jobs:  # the per-job GPU lock folders (gpuslots: /tmp/slmserve-gpu-locks-<uid>-slurm<id>)
            shutil.rmtree(f"/tmp/slmserve-gpu-locks-{os.getuid()}-slurm{jid}", ignore_errors=True)
    assert leftovers == [], f"vLLM processes of SLURM jobs {sorted(our_jobs)} left: {leftovers}"
