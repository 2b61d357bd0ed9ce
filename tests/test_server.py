"""Server lifecycle without the engine: stand-in server processes (named as such) exercise start-up
failures, infeasible memory shares, health waiting and the process-group stop."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import socket
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from slmserve import measure, server
from slmserve.loadgen import LoadResult, RequestRecord
from slmserve.server import InfeasibleError, ServerError, ServerSpec, UnsupportedError, VllmServer

# A stand-in for `python -m vllm.entrypoints.openai.api_server`: it parses --port, optionally prints a
# line and exits, or serves /health and /metrics, and it starts a child (like vLLM's engine core) in
# its own process group.
STAND_IN = textwrap.dedent(
    """
    import http.server, os, subprocess, sys, time
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    mode = os.environ["STAND_IN_MODE"]
    # the child reports the environment it inherited (vLLM's workers are where NCCL reads it)
    report = ("import json, os, sys, time; keys = ('NCCL_NVLS_ENABLE', 'TORCH_SYMM_MEM_DISABLE_MULTICAST'); "
              "open(sys.argv[1], 'w').write(json.dumps({k: os.environ.get(k) for k in keys})); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", report, os.environ["STAND_IN_PIDS"] + ".env"])
    open(os.environ["STAND_IN_PIDS"], "w").write(f"{os.getpid()} {child.pid}")
    if mode == "exit":
        print("RuntimeError: Engine core initialization failed", flush=True); sys.exit(3)
    if mode == "nomem":
        print("ValueError: No available memory for the cache blocks. Try increasing gpu_memory_utilization",
              flush=True)
        sys.exit(1)
    if mode == "noarch":
        print("ValueError: Model architectures ['FooForCausalLM'] are not supported for now. Supported "
              "architectures: dict_keys(['OPTForCausalLM', 'LlamaForCausalLM'])", flush=True)
        sys.exit(1)
    if mode == "hang":
        time.sleep(600)
    if mode == "serve-ignoring-term":  # a server whose shutdown hangs
        import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "hang-ignoring-term":  # a start still importing, which does not handle SIGTERM yet
        import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("starting", flush=True); time.sleep(600)
    if mode in ("notimpl-nomem", "notimpl-hang"):
        print("WARNING NotImplementedError: no fused kernel, falling back", flush=True)
        print("ERROR EngineCore failed to start.", flush=True)
        if mode == "notimpl-hang":
            time.sleep(600)
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        sys.exit(1)

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b""
            if self.path == "/metrics":
                body = b'vllm:cache_config_info{block_size="16",num_gpu_blocks="1234"} 1.0\\n'
            self.send_response(200); self.end_headers(); self.wfile.write(body)
        def log_message(self, *a): pass

    print("INFO GPU KV cache size: 19,744 tokens", flush=True)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    script = tmp_path / "stand_in_server.py"
    script.write_text(STAND_IN)
    monkeypatch.setenv("SLMSERVE_LOCK_DIR", str(tmp_path / "locks"))

    def make(mode: str, timeout: float = 30.0) -> tuple[ServerSpec, Path]:
        pids = tmp_path / f"pids-{mode}"
        spec = ServerSpec(
            model="unused",
            served_name="m",
            log_path=tmp_path / f"server-{mode}.log",
            max_num_seqs=4,
            max_model_len=256,
            python=sys.executable,
            env={"STAND_IN_MODE": mode, "STAND_IN_PIDS": str(pids)},
            startup_timeout_s=timeout,
            stop_timeout_s=3.0,
        )
        # Run the stand-in instead of vLLM: same argv after the module name.
        spec.argv = lambda port, _s=spec: [sys.executable, str(script), *ServerSpec.argv(_s, port)[3:]]  # type: ignore[method-assign]
        return spec, pids

    return make


def pids_of(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie not yet reaped by its parent counts as gone
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_argv_binds_loopback_and_sets_flags() -> None:
    spec = ServerSpec(
        model="config/models/opt-125m", served_name="opt125m", log_path=Path("x.log"), max_num_seqs=64,
        max_model_len=1024, tensor_parallel_size=2, gpu_memory_utilization=0.45, stream_interval=8,
    )  # fmt: skip
    argv = spec.argv(8123)
    joined = " ".join(argv)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--host 127.0.0.1 --port 8123" in joined
    for flag in ("--load-format dummy", "--skip-tokenizer-init", "--max-num-seqs 64", "--max-model-len 1024",
                 "--tensor-parallel-size 2", "--gpu-memory-utilization 0.4500", "--stream-interval 8",
                 "--no-enable-prefix-caching"):  # fmt: skip
        assert flag in joined
    assert "--kv-cache-memory-bytes" not in joined


def test_serves_and_reads_kv_capacity_then_stops_whole_group(stand_in) -> None:
    spec, pids = stand_in("serve")
    with VllmServer(spec) as srv:
        assert srv.alive() and srv.base_url.startswith("http://127.0.0.1:")
        assert srv.kv_cache_tokens == 1234 * 16 and srv.block_size == 16  # from /metrics
        leader, child = pids_of(pids)
        port = srv.port
    assert gone(leader) and gone(child)
    # the port reservation is released and its lock file deleted: none piles up per server start
    assert not list(Path(os.environ["SLMSERVE_LOCK_DIR"]).glob("port-*.lock")), port


@pytest.mark.parametrize("host", [None, "0", "1"])
def test_nvlink_multicast_stays_off_in_the_server_and_the_processes_it_starts(
    stand_in, monkeypatch: pytest.MonkeyPatch, host: str | None
) -> None:
    """NCCL_NVLS_ENABLE=0 (and torch's multicast off) reach the engine's processes whether or not the host's
    environment sets it: NVLink multicast can take a shared host's GPUs out of service."""
    for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST"):
        monkeypatch.delenv(key, raising=False)
    if host is not None:
        monkeypatch.setenv("NCCL_NVLS_ENABLE", host)
    spec, pids = stand_in("serve")
    report = Path(f"{pids}.env")
    with VllmServer(spec):
        deadline = time.monotonic() + 30
        while not (report.exists() and report.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.05)
        seen = json.loads(report.read_text())
    assert seen == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def test_exit_before_healthy_fails_at_once_with_log_tail(stand_in) -> None:
    spec, pids = stand_in("exit", timeout=60)
    t0 = time.monotonic()
    with pytest.raises(ServerError, match="exited with code 3 before becoming healthy") as info:
        VllmServer(spec).__enter__()
    assert time.monotonic() - t0 < 10
    assert "Engine core initialization failed" in str(info.value)  # the log tail is in the message
    assert not isinstance(info.value, InfeasibleError)
    assert all(gone(p) for p in pids_of(pids))


def test_memory_refusal_is_infeasible(stand_in) -> None:
    spec, _ = stand_in("nomem")
    with pytest.raises(InfeasibleError) as info:
        VllmServer(spec).__enter__()
    assert "No available memory for the cache blocks" in info.value.reason


def test_architecture_refusal_is_unsupported(stand_in) -> None:
    spec, pids = stand_in("noarch")
    with pytest.raises(UnsupportedError) as info:
        VllmServer(spec).__enter__()
    assert info.value.reason == "Model architectures ['FooForCausalLM'] are not supported for now"
    assert all(gone(p) for p in pids_of(pids))


def test_out_of_memory_wins_over_a_not_implemented_line(stand_in) -> None:
    spec, _ = stand_in("notimpl-nomem")
    with pytest.raises(InfeasibleError) as info:
        VllmServer(spec).__enter__()
    assert "out of memory" in info.value.reason


def test_a_start_that_hangs_is_an_error_not_an_unsupported_model(stand_in) -> None:
    spec, pids = stand_in("notimpl-hang", timeout=3.0)
    with pytest.raises(ServerError) as info:
        VllmServer(spec).__enter__()
    assert not isinstance(info.value, UnsupportedError | InfeasibleError)
    assert "not healthy after 3 s" in str(info.value)
    assert all(gone(p) for p in pids_of(pids))


def test_a_refusal_left_in_the_log_by_an_earlier_start_does_not_count(stand_in) -> None:
    spec, _ = stand_in("exit")
    spec.log_path.write_text("ValueError: Model architectures ['FooForCausalLM'] are not supported for now.\n")
    with pytest.raises(ServerError) as info:
        VllmServer(spec).__enter__()
    assert not isinstance(info.value, UnsupportedError | InfeasibleError)
    assert "Engine core initialization failed" in str(info.value)


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        ("ValueError: Model architectures ['MPTForCausalLM'] are not supported for now. Supported architectures: "
         "dict_keys(['A', 'B'])", "Model architectures ['MPTForCausalLM'] are not supported for now"),
        ("ValueError: Model architecture GPTJForCausalLM was supported in vLLM until v0.9.0, and is not supported "
         "anymore. Please use an older version", "Model architecture GPTJForCausalLM was supported in vLLM until "
         "v0.9.0, and is not supported anymore"),
        ("ValueError: Model architecture XForCausalLM is not supported in-tree anymore. Please install the plugin",
         "Model architecture XForCausalLM is not supported in-tree anymore"),
        ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n  Value error, Model "
         "architecture MPTForCausalLM was supported in vLLM until v0.28.0, and is not supported anymore. Please use "
         "an older version of vLLM. [type=value_error, input_value=ArgsKwargs((), {'model': 'x'})]",
         "Model architecture MPTForCausalLM was supported in vLLM until v0.28.0, and is not supported anymore"),
        # vLLM 0.26.0, MPT-7B, H100 (lines of the real log): the engine core fails to start on it
        ("(EngineCore pid=4314) ERROR 11-21 16:49:17 [core.py:1330] EngineCore failed to start.\n"
         "(EngineCore pid=4314)     raise NotImplementedError(\n(EngineCore pid=4314) NotImplementedError: FA2 does "
         "not support scheduler_metadata, q_descale, k_descale, v_descale",
         "NotImplementedError: FA2 does not support scheduler_metadata, q_descale, k_descale, v_descale"),
        # a NotImplementedError that vLLM or torch caught (a warning's traceback) is not a refusal
        ("WARNING fallback: NotImplementedError: no fused kernel for this shape", None),
        ("ValueError: No available memory for the cache blocks.", None),
    ],
)  # fmt: skip
def test_unsupported_reason(log: str, expected: str | None) -> None:
    reason = server.unsupported_reason(f"INFO start\n{log}\nINFO more\n")
    assert reason == expected if expected is None else reason is not None and reason.startswith(expected)
    assert reason is None or ("INFO more" not in reason and "[type=" not in reason)


def test_health_timeout_stops_the_server(stand_in) -> None:
    spec, pids = stand_in("hang", timeout=2.0)
    with pytest.raises(ServerError, match="not healthy after 2 s"):
        VllmServer(spec).__enter__()
    assert all(gone(p) for p in pids_of(pids))


def test_sigterm_in_main_thread_unwinds_and_stops(stand_in) -> None:
    spec, pids = stand_in("serve")
    server.install_signal_handlers()
    try:
        with pytest.raises(server.Terminated, match="SIGTERM"), VllmServer(spec):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        assert all(gone(p) for p in pids_of(pids))
    finally:
        restore_signals()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("ValueError: No available memory for the cache blocks. Try increasing", "No available memory"),
        (
            "ValueError: Available memory on node 0 (7.26/8.59 GiB) on startup is less than desired CPU memory "
            "utilization (0.92, 7.9 GiB).",
            "less than desired CPU memory utilization",
        ),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "out of memory"),
        ("INFO all fine", None),
    ],
)
def test_infeasible_reason(line: str, expected: str | None) -> None:
    reason = server.infeasible_reason(f"INFO start\n{line}\nINFO more\n")
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason and "INFO more" not in reason


def test_kv_tokens_from_log() -> None:
    log = "x\n(EngineCore pid=1) INFO [kv_cache_utils.py:2327] CPU KV cache size: 29,056 tokens, Maximum\n"
    assert server.kv_cache_tokens_from_log(log) == 29056
    assert server.kv_cache_tokens_from_log("GPU KV cache size: 2,056,000 tokens") == 2056000
    assert server.kv_cache_tokens_from_log("nothing") is None


def test_reserved_ports_are_distinct_and_held(tmp_path: Path) -> None:
    held = [server.reserve_port(tmp_path) for _ in range(5)]
    ports = [p for p, _ in held]
    assert len(set(ports)) == 5
    for port, _ in held:
        fd = os.open(tmp_path / f"port-{port}.lock", os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
    for port, fd in held:
        server.release_port(port, fd, tmp_path)
    assert not list(tmp_path.glob("port-*.lock"))


def test_a_port_lock_deleted_by_its_holder_is_not_taken_as_held(tmp_path: Path, monkeypatch) -> None:
    """A job that opened a port's lock file just before its holder deleted it must not count that
    stale file's lock as its own: it takes another port."""
    stale = 4242
    old = os.open(tmp_path / f"port-{stale}.lock", os.O_RDWR | os.O_CREAT)
    (tmp_path / f"port-{stale}.lock").unlink()
    (tmp_path / f"port-{stale}.lock").write_text("")  # a new holder's file of the same name
    new = os.open(tmp_path / f"port-{stale}.lock", os.O_RDWR)
    fcntl.flock(new, fcntl.LOCK_EX | fcntl.LOCK_NB)
    real_open = os.open
    calls = iter([old])
    monkeypatch.setattr(server.os, "open", lambda *a, **k: next(calls, None) or real_open(*a, **k))

    class Sock:
        ports = iter([stale, 4243])

        def __init__(self, *a: object) -> None:
            self.port = next(Sock.ports)

        def __enter__(self) -> Sock:
            return self

        def __exit__(self, *a: object) -> None:
            return None

        def bind(self, addr: object) -> None:
            return None

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(server.socket, "socket", Sock)
    port, fd = server.reserve_port(tmp_path)
    assert port == 4243
    server.release_port(port, fd, tmp_path)
    os.close(new)


def _load_with_errors(n_ok: int, n_error: int) -> LoadResult:
    records = [RequestRecord(request_id=i, replica=0, scheduled_s=0.0, status="ok") for i in range(n_ok)] + [
        RequestRecord(request_id=n_ok + i, replica=0, scheduled_s=0.0, error="ConnectError: refused")
        for i in range(n_error)
    ]
    return LoadResult(records, 0.0, 0.0, 1, None, None, None, True, True, n_ok, n_error, 1.0, 0)


def test_a_load_that_fails_as_the_server_dies_is_reported_as_its_death(stand_in) -> None:
    """A killed server's connections fail a moment before its process can be reaped: the requests'
    errors arrive while ``alive()`` still says yes. The failure must still name the server's death."""
    spec, pids = stand_in("serve")
    with VllmServer(spec) as srv:
        leader, _ = pids_of(pids)
        assert srv.alive()
        threading.Timer(0.5, os.killpg, (leader, signal.SIGKILL)).start()
        with pytest.raises(ServerError, match="server died during the measured run at batch 8") as err:
            measure.check_load(srv, _load_with_errors(3, 5), "at batch 8")
        assert "last lines of the server log" in str(err.value) and "KV cache size" in str(err.value)


def test_failed_requests_on_a_live_server_are_named_with_the_first_error(
    stand_in, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(measure, "DEATH_GRACE_S", 0.2)
    spec, _ = stand_in("serve")
    with VllmServer(spec) as srv:
        measure.check_load(srv, _load_with_errors(4, 0), "at batch 4")  # a clean load on a live server passes
        with pytest.raises(ServerError, match=r"2 of 5 requests failed of replica 1; first error: ConnectError"):
            measure.check_load(srv, _load_with_errors(3, 2), "of replica 1")
        assert srv.alive()
        with pytest.raises(ServerError, match="server died during the measured run of replica 1"):
            measure.check_load(srv, None, "of replica 1")  # the load was cancelled: the server died


def restore_signals() -> None:
    """Python's own handlers again, after a test of server.install_signal_handlers."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def test_a_closed_terminal_stops_the_job_as_sigterm_does() -> None:
    """SIGHUP (the terminal of a Snakemake run closed) raises Terminated: without it the job died by the
    default action, no cleanup ran, and a server ignoring SIGTERM outlived it with the GPU's lock released."""
    server.install_signal_handlers()
    try:
        with pytest.raises(server.Terminated, match="SIGHUP"):
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(5)
        assert server.terminating()
    finally:
        restore_signals()


def test_a_signal_that_lands_in_an_event_loop_callback_reaches_the_job() -> None:
    """A signal's handler runs wherever the main thread is; inside asyncio's callbacks (a socket read of the
    load generator) asyncio turned any BaseException but KeyboardInterrupt and SystemExit into an error of
    that one request: the Terminated was lost and every later signal ignored (2 of 20 loads of a SIGTERM
    stress run)."""
    server.install_signal_handlers()
    try:

        async def load() -> None:
            asyncio.get_running_loop().call_soon(signal.getsignal(signal.SIGTERM), signal.SIGTERM, None)
            await asyncio.sleep(1.0)

        with pytest.raises(server.Terminated, match="SIGTERM"):
            asyncio.run(load())
    finally:
        restore_signals()


def test_interrupt_while_the_server_starts_cleans_up_within_seconds(stand_in) -> None:
    """Ctrl-C during a start that ignores SIGTERM: the server group is killed after a short grace, so the
    job is gone well within 15 s (before: 20 s of SIGTERM grace first)."""
    spec, pids = stand_in("hang-ignoring-term", timeout=120)
    server.install_signal_handlers()
    try:
        threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        with pytest.raises(server.Terminated, match="SIGINT"):
            VllmServer(spec).__enter__()
        took = time.monotonic() - t0 - 1.5
        assert all(gone(p) for p in pids_of(pids))
        assert took < spec.stop_timeout_starting_s + 5, took
    finally:
        restore_signals()


def test_scheduler_class_is_named_on_the_command_line() -> None:
    spec = ServerSpec(model="m", served_name="m", log_path=Path("x.log"), max_num_seqs=512, max_model_len=1024,
                      scheduler_cls="slmserve.vllm_scheduler.AsyncBatchCapScheduler")  # fmt: skip
    argv = spec.argv(1)
    assert argv[argv.index("--scheduler-cls") + 1] == "slmserve.vllm_scheduler.AsyncBatchCapScheduler"
    assert "--scheduler-cls" not in ServerSpec(model="m", served_name="m", log_path=Path("x.log"),
                                               max_num_seqs=4, max_model_len=64).argv(1)  # fmt: skip


def test_a_signal_during_the_grace_period_still_kills_the_server(stand_in) -> None:
    """The first SIGTERM arrives while a normal stop waits for a server that ignores SIGTERM: the Terminated
    it raises ends the wait, and the group is killed on the way out instead of surviving the job."""
    spec, pids = stand_in("serve-ignoring-term")
    server.install_signal_handlers()
    try:
        with pytest.raises(server.Terminated, match="SIGTERM"), VllmServer(spec):
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()  # lands in the 3 s grace period
        deadline = time.monotonic() + 5
        while not all(gone(p) for p in pids_of(pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(gone(p) for p in pids_of(pids))
    finally:
        restore_signals()


def test_the_port_is_released_only_after_a_killed_server_is_reaped(stand_in, monkeypatch) -> None:
    """The Terminated of a signal cuts the grace period short: the group is killed, and its port is given
    back only once the leader is reaped and its child gone (before: released while both were still there)."""
    spec, pids = stand_in("serve-ignoring-term")
    seen: list[bool] = []
    real_release = server.release_port

    def release_and_look(port: int, fd: int, lock_dir: Path | None = None) -> None:
        leader, child = pids_of(pids)
        seen.append(not Path(f"/proc/{leader}").exists() and gone(child))  # reaped, not a zombie
        real_release(port, fd, lock_dir)

    monkeypatch.setattr(server, "release_port", release_and_look)
    server.install_signal_handlers()
    try:
        with pytest.raises(server.Terminated, match="SIGTERM"), VllmServer(spec):
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()  # lands in the 3 s grace period
    finally:
        restore_signals()
    assert seen == [True]


def test_health_checks_bypass_the_hosts_http_proxy(stand_in, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host's http_proxy (here one that is not listening) must not carry the reads of 127.0.0.1."""
    for key in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(key, raising=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    for key in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(key, f"http://127.0.0.1:{dead}")
    monkeypatch.setattr(urllib.request, "_opener", None)  # urlopen's default opener reads the proxy once, as in a job
    spec, _ = stand_in("serve", timeout=15.0)
    with VllmServer(spec) as srv:
        assert srv.kv_cache_tokens == 1234 * 16  # read from /metrics, past the proxy


def test_a_second_signal_does_not_interrupt_the_cleanup(stand_in) -> None:
    """SIGINT, then SIGTERM while the server is being stopped (Snakemake and the parent watcher both signal):
    the stop still finishes and kills the server group, instead of being cut short by a second Terminated."""
    spec, pids = stand_in("serve")
    server.install_signal_handlers()
    real_kill = server.kill_group

    def kill_with_a_second_signal(proc, timeout_s):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives during the cleanup
        time.sleep(0.2)
        real_kill(proc, timeout_s)

    server.kill_group = kill_with_a_second_signal
    try:
        with pytest.raises(server.Terminated, match="SIGINT"), VllmServer(spec):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        assert all(gone(p) for p in pids_of(pids))
    finally:
        server.kill_group = real_kill
        restore_signals()
