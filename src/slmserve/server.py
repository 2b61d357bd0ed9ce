"""Lifecycle of one vLLM OpenAI-compatible server: start on 127.0.0.1, wait for health, stop the whole
process group on every path out.

The server runs in a new session (its own process group), so stopping it means signalling that group:
the API server, its engine core and its workers. If the job that started it is killed outright
(SIGKILL), the kernel sends the server SIGTERM through ``PR_SET_PDEATHSIG``, so no server outlives its
job. Call :func:`install_signal_handlers` in a job's main thread so that Snakemake's SIGTERM or a
SIGINT unwinds the ``with`` blocks (and stops the server) instead of killing the job in place.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from slmserve import enginemetrics

HOST = "127.0.0.1"
# What ServerSpec.argv sets itself; a model's engine_args may not set it again: vLLM's parser takes the last
# value given, so `--host 0.0.0.0` would open the server beyond this host and `--port` collide between jobs.
OWN_FLAGS = frozenset({
    "--model", "--served-model-name", "--host", "--port", "--uds", "--load-format", "--skip-tokenizer-init",
    "--max-num-seqs", "--max-model-len", "--tensor-parallel-size", "-tp", "--dtype", "--gpu-memory-utilization",
    "--kv-cache-memory-bytes", "--scheduler-cls", "--max-cudagraph-capture-size", "--stream-interval",
    "--enable-prefix-caching", "--no-enable-prefix-caching",
})  # fmt: skip


def own_flags(args: Sequence[str]) -> list[str]:
    """The arguments of ``args`` (``--flag`` or ``--flag=value``) that are :data:`OWN_FLAGS`."""
    return [a for a in args if a.split("=", 1)[0] in OWN_FLAGS]


# Log lines with which vLLM refuses a memory share or a cache size: results ("infeasible"), not errors.
INFEASIBLE_PATTERNS: tuple[str, ...] = (
    r"No available memory for the cache blocks",
    r"[Ii]nsufficient memory",
    r"is less than desired (GPU|CPU) memory utilization",
    r"larger than the available KV cache memory",
    r"(CUDA|torch\.OutOfMemoryError).{0,40}out of memory",
    r"Not enough memory",
    r"KV cache is needed, which is larger than",
    r"max seq len .* is larger than the maximum number of tokens that can be stored in KV cache",
)
# Log lines with which vLLM refuses a model architecture (vllm/model_executor/models/registry.py): the
# model is "unsupported" by this engine, a result reported in captions, not an error of the run.
UNSUPPORTED_PATTERNS: tuple[str, ...] = (
    r"Model architectures \[.*?\] are not supported for now",
    r"Model architecture \S+ was supported in vLLM until v\S+, and is not supported anymore",
    r"Model architecture \S+ is not supported in-tree anymore",
)
# The engine loads the model, then its start fails for lack of an implementation of an operation the model
# needs (vLLM 0.26.0, MPT-7B on an H100: ALiBi layers fall back to FlashAttention 2, which rejects FA3's
# scheduler metadata). Counted only when the engine core reports that it failed to start, and the last
# NotImplementedError of the log (the root of that failure) is the reason.
ENGINE_START_FAILED = re.compile(r"EngineCore failed to start|Engine core initialization failed")
_NOT_IMPLEMENTED = re.compile(r"NotImplementedError: ([^\n]+)")
_KV_LOG_RE = re.compile(r"(?:GPU|CPU|XPU|TPU)? ?KV cache size: ([\d,]+) tokens")


class ServerError(RuntimeError):
    """The server failed to start or died; ``log_tail`` holds the end of its log."""

    def __init__(self, message: str, log_path: Path | None = None, log_tail: str = "") -> None:
        self.log_path = log_path
        self.log_tail = log_tail
        where = f" (log: {log_path})" if log_path else ""
        tail = f"\n--- last lines of the server log ---\n{log_tail}" if log_tail else ""
        super().__init__(f"{message}{where}{tail}")


class InfeasibleError(ServerError):
    """vLLM refused the configuration for lack of memory: recorded as an infeasible run."""

    def __init__(self, reason: str, log_path: Path | None = None, log_tail: str = "") -> None:
        self.reason = reason
        super().__init__(f"infeasible: {reason}", log_path, log_tail)


class UnsupportedError(ServerError):
    """vLLM does not serve the model (its architecture refused, or its engine failing to start on an operation
    it does not implement): recorded as an unsupported model."""

    def __init__(self, reason: str, log_path: Path | None = None, log_tail: str = "") -> None:
        self.reason = reason
        super().__init__(f"unsupported: {reason}", log_path, log_tail)


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM, SIGINT or SIGHUP so that cleanup runs. A KeyboardInterrupt, as
    asyncio re-raises only that (and SystemExit) from its callbacks: another BaseException raised while it
    reads a socket becomes one request's error, and the signal is lost."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"terminated by {signal.Signals(signum).name}")


_TERMINATING = threading.Event()


def terminating() -> bool:
    """Whether this process has been told to stop (its first SIGTERM, SIGINT or SIGHUP)."""
    return _TERMINATING.is_set()


def install_signal_handlers() -> None:
    """Turn the first SIGTERM, SIGINT or SIGHUP (a closed terminal) after this call into :class:`Terminated`
    in the main thread; later ones are ignored, so they cannot interrupt the cleanup that stops the servers."""
    _TERMINATING.clear()

    def _raise(signum: int, _frame: FrameType | None) -> None:
        if _TERMINATING.is_set():
            return
        _TERMINATING.set()
        raise Terminated(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _raise)


def _lock_dir() -> Path:
    path = Path(os.environ.get("SLMSERVE_LOCK_DIR", f"/tmp/slmserve-gpu-locks-{os.getuid()}"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def reserve_port(lock_dir: Path | None = None, attempts: int = 50) -> tuple[int, int]:
    """A free TCP port on 127.0.0.1 that no other job of this workflow holds.

    Returns ``(port, fd)``: the port is held by a ``flock`` on ``port-N.lock`` until
    :func:`release_port`, which also deletes the file.
    """
    lock_dir = lock_dir or _lock_dir()
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        path = lock_dir / f"port-{port}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # a holder may have deleted the file between our open and our lock: then the lock is void
            if os.fstat(fd).st_ino != os.stat(path).st_ino:
                raise BlockingIOError
        except (BlockingIOError, FileNotFoundError):
            os.close(fd)
            continue
        return port, fd
    raise ServerError(f"could not reserve a free port on {HOST} after {attempts} attempts")


def release_port(port: int, fd: int, lock_dir: Path | None = None) -> None:
    """Give up a port taken with :func:`reserve_port`: delete its lock file (while holding it), then unlock."""
    with contextlib.suppress(OSError):
        (lock_dir or _lock_dir()).joinpath(f"port-{port}.lock").unlink()
    os.close(fd)


def pdeathsig() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class ServerSpec:
    """How to start one vLLM server. ``model`` is a directory with ``config.json`` (dummy weights),
    a directory with real weights, or a hub id."""

    model: str
    served_name: str
    log_path: Path
    max_num_seqs: int
    max_model_len: int
    tensor_parallel_size: int = 1
    load_format: str = "dummy"
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    dtype: str = "auto"
    enable_prefix_caching: bool = False
    stream_interval: int | None = None
    scheduler_cls: str | None = None
    max_cudagraph_capture_size: int | None = None
    extra_args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 900.0
    stop_timeout_s: float = 10.0
    # A server still starting may not handle SIGTERM yet (imports, CUDA graph capture): kill it sooner.
    stop_timeout_starting_s: float = 2.0
    python: str = sys.executable

    def argv(self, port: int) -> list[str]:
        args = [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model,
            "--served-model-name", self.served_name,
            "--host", HOST, "--port", str(port),
            "--load-format", self.load_format,
            "--skip-tokenizer-init",
            "--max-num-seqs", str(self.max_num_seqs),
            "--max-model-len", str(self.max_model_len),
            "--tensor-parallel-size", str(self.tensor_parallel_size),
            "--dtype", self.dtype,
            "--disable-uvicorn-access-log",
            "--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching",
        ]  # fmt: skip
        if self.gpu_memory_utilization is not None:
            args += ["--gpu-memory-utilization", f"{self.gpu_memory_utilization:.4f}"]
        if self.kv_cache_memory_bytes is not None:
            args += ["--kv-cache-memory-bytes", str(self.kv_cache_memory_bytes)]
        if self.stream_interval is not None:
            args += ["--stream-interval", str(self.stream_interval)]
        if self.scheduler_cls is not None:
            args += ["--scheduler-cls", self.scheduler_cls]
        if self.max_cudagraph_capture_size is not None:
            args += ["--max-cudagraph-capture-size", str(self.max_cudagraph_capture_size)]
        if own := own_flags(self.extra_args):
            raise ValueError(f"extra vLLM arguments {' '.join(own)}: slmserve sets these itself for every server; "
                             "remove them from the model's engine_args")  # fmt: skip
        return [*args, *self.extra_args]


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def infeasible_reason(log_text: str) -> str | None:
    """The log line with which vLLM refused the memory share, if any."""
    for pattern in INFEASIBLE_PATTERNS:
        match = re.search(pattern, log_text)
        if match:
            start = log_text.rfind("\n", 0, match.start()) + 1
            end = log_text.find("\n", match.end())
            return log_text[start : end if end >= 0 else None].strip()[-400:]
    return None


def unsupported_reason(log_text: str) -> str | None:
    """Why the engine does not serve the model: its refusal of the architecture, from the match to the end
    of its sentence (without the list of supported architectures that follows, nor pydantic's wrapping);
    else, if the engine core failed to start on a ``NotImplementedError``, that error's last line."""
    for pattern in UNSUPPORTED_PATTERNS:
        match = re.search(pattern, log_text)
        if match:
            end = log_text.find("\n", match.start())
            line = log_text[match.start() : end if end >= 0 else None]
            return line.split(". Supported architectures")[0].split(" [type=")[0][:300]
    missing = _NOT_IMPLEMENTED.findall(log_text)
    if missing and ENGINE_START_FAILED.search(log_text):
        return f"NotImplementedError: {missing[-1].strip()}"[:300]
    return None


def kv_cache_tokens_from_log(log_text: str) -> int | None:
    found = _KV_LOG_RE.findall(log_text)
    return int(found[-1].replace(",", "")) if found else None


def _get(url: str, timeout: float) -> tuple[int, bytes]:
    try:
        with enginemetrics.LOOPBACK.open(url, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""


class VllmServer:
    """A running vLLM server; use as a context manager."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self._port_fd: int | None = None
        self._log: IO[bytes] | None = None
        self._log_start = 0  # where this start's part of the (appended) log begins
        self.launched_at = 0.0  # when the process was launched (time.monotonic)
        self.startup_s: float | None = None
        self.kv_cache_tokens: int | None = None
        self.block_size: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The API server's process id (the engine core is its child) while it is launched."""
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exited_within(self, timeout_s: float) -> bool:
        """True if the server process has exited, or exits within ``timeout_s``. A killed server's
        connections fail a moment before its process can be reaped, so a load that sees connection
        errors asks this rather than :meth:`alive`."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def __enter__(self) -> VllmServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the server and wait until it is healthy (:meth:`launch`, then :meth:`wait_ready`)."""
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the server process and return at once; :meth:`wait_ready` waits for it. Several servers
        launched before any is waited for start together."""
        spec = self.spec
        self.port, self._port_fd = reserve_port()
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = spec.log_path.open("ab")
        self._log_start = self._log.tell()
        self._log.write(f"# slmserve: {' '.join(spec.argv(self.port))}\n".encode())
        self._log.flush()
        env = {**os.environ, **spec.env}
        # Never let NCCL use NVLink multicast (it can take a shared host's GPUs out of service), whatever the host sets.
        env["NCCL_NVLS_ENABLE"] = "0"
        env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        self.launched_at = time.monotonic()
        self.proc = subprocess.Popen(
            spec.argv(self.port),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=pdeathsig,
        )

    def wait_ready(self) -> None:
        """Wait until the launched server answers /health (or raise why not); read its KV capacity."""
        self._wait_healthy(self.launched_at)
        self.startup_s = time.monotonic() - self.launched_at
        self._read_kv_capacity()

    def _fail(self, message: str, exited: bool) -> None:
        """Raise why the start failed: a memory refusal (infeasible) first, then -- only if the server
        exited, never for a start that hangs -- a model the engine does not serve (unsupported), else an
        error."""
        tail = log_tail(self.spec.log_path)
        full = ""
        if self.spec.log_path.exists():
            with self.spec.log_path.open("rb") as fh:
                fh.seek(self._log_start)  # earlier starts' lines (an old refusal) do not count
                full = fh.read().decode(errors="replace")
        reason = infeasible_reason(full)
        if reason is not None:
            raise InfeasibleError(reason, self.spec.log_path, tail)
        unsupported = unsupported_reason(full) if exited else None
        if unsupported is not None:
            raise UnsupportedError(unsupported, self.spec.log_path, tail)
        raise ServerError(message, self.spec.log_path, tail)

    def _wait_healthy(self, t0: float) -> None:
        deadline = t0 + self.spec.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                self._fail(f"vLLM server exited with code {self.proc.returncode} before becoming healthy", True)
            with contextlib.suppress(OSError):
                status, _ = _get(f"{self.base_url}/health", timeout=2.0)
                if status == 200:
                    return
            time.sleep(0.5)
        self._fail(f"vLLM server not healthy after {self.spec.startup_timeout_s:.0f} s", False)

    def _read_kv_capacity(self) -> None:
        """KV-cache capacity in tokens: ``num_gpu_blocks * block_size`` from /metrics, else the log."""
        info = enginemetrics.labels(enginemetrics.fetch(self.base_url), "vllm:cache_config_info")
        blocks, size = info.get("num_gpu_blocks"), info.get("block_size")
        if blocks not in (None, "None") and size not in (None, "None"):
            self.block_size = int(size)
            self.kv_cache_tokens = int(blocks) * int(size)
            return
        self.kv_cache_tokens = kv_cache_tokens_from_log(self.spec.log_path.read_text(errors="replace"))

    def counters(self) -> dict[str, float]:
        """vLLM's Prometheus counters (``vllm:*_total``), each summed over its label sets; empty if
        /metrics cannot be read."""
        return enginemetrics.counters(enginemetrics.fetch(self.base_url))

    def stop(self) -> None:
        """Stop the server's whole process group (SIGTERM, then SIGKILL) and wait for it."""
        proc, self.proc = self.proc, None
        try:
            if proc is not None:
                started = self.startup_s is not None
                kill_group(proc, self.spec.stop_timeout_s if started else self.spec.stop_timeout_starting_s)
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
            if self._port_fd is not None and self.port is not None:
                release_port(self.port, self._port_fd)
                self._port_fd = None

    def info(self) -> dict[str, Any]:
        return {
            "port": self.port,
            "startup_s": self.startup_s,
            "launched_at": self.launched_at,  # time.monotonic() of the launch: compare within one job only
            "kv_cache_tokens": self.kv_cache_tokens,
            "block_size": self.block_size,
            "argv": self.spec.argv(self.port or 0)[1:],
            "log": str(self.spec.log_path),
        }


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_and_wait(proc: subprocess.Popen[bytes], sig: signal.Signals, wait_s: float) -> bool:
    """Send ``sig`` to the group led by ``proc``; whether the leader is reaped and the group gone in ``wait_s``."""
    pgid = proc.pid  # start_new_session: the group id is the leader's pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
        if proc.poll() is not None and not _group_alive(pgid):
            return True
    return False


def kill_group(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Stop the process group led by ``proc``: SIGTERM, ``timeout_s`` of grace, then SIGKILL; return once
    it is gone, so that its port and GPU memory are free for the next server."""
    try:
        if not _signal_and_wait(proc, signal.SIGTERM, timeout_s):
            _signal_and_wait(proc, signal.SIGKILL, 10.0)
            proc.wait()
    except BaseException:
        # a Terminated cut the grace short: the group must be gone before the caller frees its port
        _signal_and_wait(proc, signal.SIGKILL, 10.0)
        raise
