"""A measuring job and its surroundings (:mod:`slmserve.jobguard`): it stops, with its server, when the
Snakemake process that started it is killed, and a second job refuses a target that a live job measures.
The "Snakemake" parent and the server are stand-ins (named as such); the real engine is in test_engine.py."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from slmserve import jobguard
from tests.test_server import STAND_IN

# The job: guard its target, start a stand-in server, then "measure" for a minute.
JOB = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from slmserve.jobguard import guard
    from slmserve.server import ServerSpec, VllmServer
    target, script, log = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    spec = ServerSpec(model="unused", served_name="m", log_path=log, max_num_seqs=4, max_model_len=64,
                      env={"STAND_IN_MODE": "serve", "STAND_IN_PIDS": str(log) + ".pids"}, startup_timeout_s=30)
    spec.argv = lambda port, _s=spec: [sys.executable, script, *ServerSpec.argv(_s, port)[3:]]
    with guard([target], "test job"), VllmServer(spec):
        print("measuring", flush=True)
        time.sleep(60)
        target.write_text("done")
    """
)
# A stand-in for Snakemake: its command line names it, and it starts the job and waits.
FAKE_SNAKEMAKE = "import subprocess, sys, time; p = subprocess.Popen(sys.argv[1:]); time.sleep(120)"


def _job_argv(tmp_path: Path, target: Path) -> list[str]:
    script = tmp_path / "stand_in_server.py"
    script.write_text(STAND_IN)
    return [sys.executable, "-c", JOB, str(target), str(script), str(tmp_path / "server.log")]


def _wait(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return False


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_job_orphaned_by_kill_9_of_snakemake_stops_with_its_server(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SLMSERVE_LOCK_DIR", str(tmp_path / "locks"))
    target = tmp_path / "bs1.requests.parquet"
    fake = tmp_path / "snakemake"  # run as `python .../snakemake`, as its console script runs
    fake.write_text(FAKE_SNAKEMAKE)
    parent = subprocess.Popen([sys.executable, str(fake), *_job_argv(tmp_path, target)], env=os.environ)
    try:
        assert _wait(lambda: Path(f"{tmp_path}/server.log.pids").exists() and jobguard.lock_path(target).exists(), 60)
        job = psutil.Process(parent.pid).children()[0]
        server_pids = [int(p) for p in Path(f"{tmp_path}/server.log.pids").read_text().split()]
        assert all(_alive(p) for p in server_pids)
        os.kill(parent.pid, signal.SIGKILL)  # the job is reparented, as after `kill -9` of Snakemake
        parent.wait()
        t0 = time.monotonic()
        assert _wait(lambda: not _alive(job.pid), 30), "the orphaned job still runs 30 s after its parent died"
        assert _wait(lambda: not any(_alive(p) for p in server_pids), 30 - (time.monotonic() - t0))
        assert not target.exists()  # it stopped measuring: nothing that looks done
        assert not jobguard.lock_path(target).exists()  # and released its target
    finally:
        for proc in psutil.Process().children(recursive=True):
            proc.kill()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["/venv/bin/python", "/venv/bin/snakemake", "all", "--cores", "4"], True),
        (["snakemake", "all"], True),
        (["python3", "-u", "-m", "snakemake", "--configfile", "c.yaml"], True),
        (["python3.12", "-um", "snakemake"], True),
        (["/usr/bin/python3", "-sP", "/usr/bin/snakemake", "all"], True),  # a distribution's shebang options
        (["python", "-X", "dev", "-W", "error", "/venv/bin/snakemake"], True),
        (["python", "-m", "snakemake.cli"], True),
        (["python", "-m", "pytest", "tests/snakemake"], False),
        (["python", "-c", "import snakemake", "snakemake"], False),
        (["cat", "snakemake"], False),
        (["bash", "-c", "python3 -m snakemake --cores 4; tail -5 /tmp/wf/snakemake.log"], False),
        (["/bin/bash", "-c", "set -euo pipefail; python3 /wf/.snakemake/scripts/tmp1.kv_probe.py"], False),
        (["python3", "/wf/.snakemake/scripts/tmp1.kv_probe.py"], False),
        (["python3", "fake_snakemake.py"], False),
    ],
)
def test_only_snakemake_itself_counts_as_snakemake(argv: list[str], expected: bool) -> None:
    assert jobguard.is_snakemake(argv) is expected


def test_a_job_outlives_a_shell_that_mentions_snakemake_while_snakemake_lives(tmp_path: Path) -> None:
    """2026-11-28: a KV-cache probe was stopped when the device call's shell ended, because that shell's
    script read snakemake.log; Snakemake itself, started by that shell, was still running."""
    target, pid_file = tmp_path / "bs1.requests.parquet", tmp_path / "smk.pid"
    fake = tmp_path / "snakemake"
    fake.write_text(FAKE_SNAKEMAKE)
    guarded = tmp_path / "guarded"  # the job has taken its ancestors: the shell may end now
    job = ("import sys, time; from pathlib import Path; from slmserve.jobguard import guard\n"
           "with guard([sys.argv[1]], 'probe'):\n    Path(sys.argv[2]).touch()\n"
           f"    time.sleep(3 * {jobguard.WATCH_S} + 2)\n    open(sys.argv[1], 'w').write('done')")  # fmt: skip
    smk = shlex.join([sys.executable, str(fake), sys.executable, "-c", job, str(target), str(guarded)])
    script = (f"{smk} & echo $! > {pid_file}; for _ in $(seq 600); do [ -e {guarded} ] && break; sleep 0.05; done; "
              f"tail -1 {tmp_path}/snakemake.log")  # fmt: skip
    try:
        subprocess.run(["bash", "-c", script], stderr=subprocess.DEVNULL, timeout=60, check=False)
        assert guarded.exists() and _alive(int(pid_file.read_text()))  # the shell has ended, Snakemake lives on
        assert _wait(target.exists, 30), "the job stopped when a shell mentioning snakemake.log exited"
    finally:
        for proc in psutil.Process().children(recursive=True):
            proc.kill()
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_second_job_refuses_a_target_a_live_job_measures(tmp_path: Path) -> None:
    target = tmp_path / "bs8.requests.parquet"
    first = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from slmserve.jobguard import target_lock\n"
         "with target_lock(sys.argv[1], 'first'):\n    print('held', flush=True); time.sleep(60)", str(target)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert first.stdout.readline().strip() == "held"
        busy = pytest.raises(jobguard.TargetBusyError, match=rf"PID {first.pid} on .*first.*kill {first.pid}")
        with busy, jobguard.target_lock(target, "second"):
            pass
    finally:
        first.kill()
        first.wait()
    with jobguard.target_lock(target, "third"):  # a dead holder's lock is free (the kernel released it)
        assert jobguard.lock_path(target).exists()
    assert not jobguard.lock_path(target).exists()


def test_a_job_started_without_snakemake_is_not_stopped_when_its_parent_exits(tmp_path: Path) -> None:
    """A benchmark detached on purpose (its launcher exits) keeps measuring: only Snakemake is watched."""
    target = tmp_path / "bs1.requests.parquet"
    launcher = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]], "
                "start_new_session=True)")  # fmt: skip
    job = ("import sys, time; from slmserve.jobguard import guard\n"
           "with guard([sys.argv[1]], 'detached'):\n"
           "    time.sleep(3 * 2.0 + 2)\n    open(sys.argv[1], 'w').write('done')")  # fmt: skip
    subprocess.run([sys.executable, "-c", launcher, job, str(target)], check=True, timeout=30)
    assert _wait(target.exists, 30), "the detached job was stopped when its launcher exited"
