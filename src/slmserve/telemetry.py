"""DCGM-style GPU and host telemetry, sampled in a background thread.

:class:`Sampler` reads, every ``interval_s`` (100 ms by default) and for each GPU of the job, through
NVML (:mod:`slmserve.nvml`):

============================  ==============================================================================
column                        source
============================  ==============================================================================
``gpu_util_pct``              ``nvmlDeviceGetUtilizationRates(h).gpu`` (% of time a kernel ran)
``mem_used_mb``               ``nvmlDeviceGetMemoryInfo(h).used`` in MiB (2**20 bytes), as nvidia-smi shows it
``power_w``                   ``nvmlDeviceGetPowerUsage(h)`` (milliwatts) / 1000; on Hopper the driver's
                              ~1 s moving average, so it lags load changes (use ``energy_mj`` for windows)
``energy_mj``                 ``nvmlDeviceGetTotalEnergyConsumption(h)``: cumulative millijoules since the
                              driver loaded (differences give energy over a window). A read costs ~4 ms
                              of CPU, 40 times the other reads: ``energy_every=N`` reads it every N-th tick
``sm_clock_mhz``              ``nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)``
``sm_active_pct``             GPM ``NVML_GPM_METRIC_SM_UTIL`` (what DCGM_FI_PROF_SM_ACTIVE reports)
``sm_occupancy_pct``          GPM ``NVML_GPM_METRIC_SM_OCCUPANCY`` (DCGM_FI_PROF_SM_OCCUPANCY)
``dram_bw_pct``               GPM ``NVML_GPM_METRIC_DRAM_BW_UTIL`` (DCGM_FI_PROF_DRAM_ACTIVE)
``tensor_active_pct``         GPM ``NVML_GPM_METRIC_ANY_TENSOR_UTIL`` (any tensor pipe busy)
``cpu_util_pct``              ``psutil.cpu_percent(interval=None)``: system-wide host CPU over the last tick
============================  ==============================================================================

A GPM value (Hopper or newer) covers exactly the interval that ends at its row's timestamp: each tick
takes a GPM sample and compares it with the previous tick's. NVML wants the two more than 100 ms apart,
so with GPM the interval is at least 0.1 s (the effective value is ``Sampler.status["interval_s"]``).
The first row comes one interval after the start. MIG instances are not handled (whole-GPU samples).

GPU ids are physical NVML indices. All GPUs of one tick share its timestamps. Missing telemetry never
raises: where NVML or GPM is absent or one call fails, the row keeps the schema with nulls, the flags
``nvml_ok``/``gpm_ok`` say what it holds, and :attr:`Sampler.status` says why. With no GPUs, or without
NVML, every tick writes one host row with ``gpu`` null.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import numpy as np
import polars as pl
import psutil

from slmserve import nvml

SCHEMA: dict[str, pl.DataType] = {
    "t_mono_s": pl.Float64(),
    "t_wall_s": pl.Float64(),
    "gpu": pl.Int32(),
    "gpu_util_pct": pl.Float64(),
    "mem_used_mb": pl.Float64(),
    "power_w": pl.Float64(),
    "energy_mj": pl.Float64(),
    "sm_clock_mhz": pl.Float64(),
    "sm_active_pct": pl.Float64(),
    "sm_occupancy_pct": pl.Float64(),
    "dram_bw_pct": pl.Float64(),
    "tensor_active_pct": pl.Float64(),
    "cpu_util_pct": pl.Float64(),
    "nvml_ok": pl.Boolean(),
    "gpm_ok": pl.Boolean(),
}

GPM_COLUMNS = ("sm_active_pct", "sm_occupancy_pct", "dram_bw_pct", "tensor_active_pct")

GPM_MIN_INTERVAL_S = 0.1
"""NVML needs two GPM samples more than 100 ms apart."""

_MIB = float(1 << 20)
# (pynvml constant name, value in nvidia-ml-py 13.615) for the GPM metrics, in column order.
_GPM_METRICS: tuple[tuple[str, int], ...] = (
    ("NVML_GPM_METRIC_SM_UTIL", 2),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", 3),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", 10),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5),
)
_NO_GPM: tuple[None, None, None, None] = (None, None, None, None)


def empty_frame() -> pl.DataFrame:
    """The telemetry schema with zero rows."""
    return pl.DataFrame(schema=SCHEMA)


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _note(errors: dict[str, str], key: str, exc: BaseException) -> None:
    """Keep the first error of each field (``status["field_errors"]``)."""
    errors.setdefault(key, _err(exc))


class DegenerateGpmInterval(ValueError):
    """NVML answered a GPM interval with a NaN: on an H100 (driver 580) about 1 tick in 1,000 reads 0 for
    SM activity, occupancy and tensor activity with DRAM bandwidth NaN, while the GPU is busy."""


def gpm_valid() -> pl.Expr:
    """False on rows whose GPM values include a NaN (a degenerate interval, :class:`DegenerateGpmInterval`):
    the sampler leaves such rows null since 2026-11-23, results recorded before hold the NaN and the zeros."""
    return ~pl.any_horizontal([pl.col(c).is_nan() for c in GPM_COLUMNS]).fill_null(False)


class _GpmMetrics:
    """The one reused ``c_nvmlGpmMetricsGet_t`` request for the GPM columns, in column order."""

    def __init__(self, nv: Any) -> None:
        self._nv = nv
        self._ids = tuple(getattr(nv, name, default) for name, default in _GPM_METRICS)
        self._version = getattr(nv, "NVML_GPM_METRICS_GET_VERSION", 1)
        self._mg = nv.c_nvmlGpmMetricsGet_t()
        self._prepare()

    def _prepare(self) -> None:
        mg = self._mg
        mg.version = self._version
        mg.numMetrics = len(self._ids)
        for i, mid in enumerate(self._ids):
            mg.metrics[i].metricId = mid

    def between(self, sample1: Any, sample2: Any) -> tuple[float | None, ...]:
        """The metrics over the interval from ``sample1`` to ``sample2`` (None where NVML has none)."""
        mg = self._mg
        self._prepare()
        mg.sample1 = sample1
        mg.sample2 = sample2
        self._nv.nvmlGpmMetricsGet(mg)
        values = tuple(float(m.value) if m.nvmlReturn == 0 else None for m in mg.metrics[: len(self._ids)])
        if any(v is not None and not math.isfinite(v) for v in values):
            raise DegenerateGpmInterval(f"GPM returned {values} (column order {[n for n, _ in _GPM_METRICS]})")
        return values


class _GpmReader:
    """One GPU's GPM samples in two buffers, swapped after each read: a read covers the time since the last."""

    def __init__(self, gpu: _Gpu, metrics: _GpmMetrics) -> None:
        self._gpu = gpu
        self._metrics = metrics
        self._prev: Any = None
        self._cur: Any = None
        self._primed = False
        try:
            self._prev = gpu.nv.nvmlGpmSampleAlloc()
            self._cur = gpu.nv.nvmlGpmSampleAlloc()
        except Exception:
            self.close()
            raise

    def read(self) -> tuple[tuple[float | None, ...], bool]:
        """Take a sample; the metrics since the previous one and whether there are any (not on the first)."""
        g = self._gpu
        try:
            g.nv.nvmlGpmSampleGet(g.handle, self._cur)
        except Exception as exc:  # keep the previous sample: the next value covers a longer interval
            _note(g.errors, f"gpu{g.index}.gpm_sample", exc)
            return _NO_GPM, False
        values: tuple[float | None, ...] = _NO_GPM
        ok = False
        if self._primed:
            try:
                values, ok = self._metrics.between(self._prev, self._cur), True
            except Exception as exc:
                _note(g.errors, f"gpu{g.index}.gpm_metrics", exc)
        self._prev, self._cur = self._cur, self._prev
        self._primed = True
        return values, ok

    def close(self) -> None:
        """Free both buffers (idempotent)."""
        for sample in (self._prev, self._cur):
            if sample is not None:
                try:
                    self._gpu.nv.nvmlGpmSampleFree(sample)
                except Exception as exc:
                    _note(self._gpu.errors, f"gpu{self._gpu.index}.gpm_free", exc)
        self._prev = self._cur = None


class _Gpu:
    """One GPU: its NVML handle (None when NVML has none for it), its GPM reader, and the reads of a row."""

    def __init__(self, nv: Any, index: int, errors: dict[str, str]) -> None:
        self.nv = nv
        self.index = index
        self.errors = errors
        self.handle: Any = None
        self.gpm: _GpmReader | None = None
        self._clock_sm = getattr(nv, "NVML_CLOCK_SM", 1)

    def _call(self, field: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            _note(self.errors, f"gpu{self.index}.{field}", exc)
            return None

    def read(self, read_energy: bool) -> tuple[tuple[float | None, ...], bool]:
        """The GPU columns of a row, ``gpu_util_pct`` to ``tensor_active_pct``, and ``gpm_ok``."""
        gpm, gpm_ok = self.gpm.read() if self.gpm is not None else (_NO_GPM, False)
        nv, h, call = self.nv, self.handle, self._call
        util = call("gpu_util_pct", nv.nvmlDeviceGetUtilizationRates, h)
        mem = call("mem_used_mb", nv.nvmlDeviceGetMemoryInfo, h)
        power = call("power_w", nv.nvmlDeviceGetPowerUsage, h)
        energy = call("energy_mj", nv.nvmlDeviceGetTotalEnergyConsumption, h) if read_energy else None
        clock = call("sm_clock_mhz", nv.nvmlDeviceGetClockInfo, h, self._clock_sm)
        values = (
            None if util is None else float(util.gpu),
            None if mem is None else mem.used / _MIB,
            None if power is None else power / 1000.0,
            None if energy is None else float(energy),
            None if clock is None else float(clock),
            *gpm,
        )
        return values, gpm_ok


class _Schedule:
    """Ticks on the fixed grid ``t0 + k * interval_s`` (a late tick skips the points already past), at
    least ``min_gap_s`` apart; ``t0`` is when the schedule is made."""

    def __init__(self, interval_s: float, min_gap_s: float, stop: threading.Event) -> None:
        self._interval = interval_s
        self._min_gap = min_gap_s
        self._stop = stop
        self._t0 = self._last = time.monotonic()
        self._k = 0

    def wait(self) -> float | None:
        """Sleep until the next tick and return its ``time.monotonic()``; None once ``stop`` is set."""
        self._k = max(self._k + 1, int((time.monotonic() - self._t0) / self._interval) + 1)
        if self._stop.wait(max(0.0, self._t0 + self._k * self._interval - time.monotonic())):
            return None
        gap = time.monotonic() - self._last
        if gap < self._min_gap and self._stop.wait(self._min_gap - gap):
            return None
        self._last = time.monotonic()
        return self._last


def _bare_row(t_mono: float, t_wall: float, gpu: int | None, cpu: float | None) -> tuple:
    """A sample without NVML data: timestamps, the GPU index (None for host rows), CPU utilisation."""
    return (t_mono, t_wall, gpu, *([None] * 9), cpu, False, False)


class Sampler:
    """Sample GPU (NVML + GPM) and host CPU telemetry in a background thread.

    Use as ``with Sampler([0, 1]) as s: ...`` then read ``s.frame``, or call :meth:`start` and
    :meth:`stop`. A sampler is single-use. ``nvml`` injects a module with pynvml's API (for tests);
    by default ``pynvml`` is imported when the sampler starts. ``energy_every=N`` reads the (costly)
    energy counter on every N-th tick only (the first tick included), leaving it null in between.
    """

    def __init__(
        self,
        gpu_ids: Sequence[int],
        interval_s: float = 0.1,
        nvml: Any | None = None,
        *,
        energy_every: int = 1,
    ) -> None:
        if not interval_s > 0 or not math.isfinite(interval_s):
            raise ValueError(f"interval_s must be a positive number, got {interval_s!r}")
        if energy_every < 1:
            raise ValueError(f"energy_every must be >= 1, got {energy_every!r}")
        self.energy_every = int(energy_every)
        self.gpu_ids: list[int] = [int(i) for i in gpu_ids]
        self.interval_s = float(interval_s)
        self.frame: pl.DataFrame | None = None
        self.status: dict[str, Any] = {
            "nvml": False,
            "gpm": False,
            "reason": None,
            "interval_s": self.interval_s,
            "field_errors": {},  # "gpu<i>.<column>" -> first error seen for that field
        }
        self._nvml_arg = nvml
        self._nvml_session = contextlib.ExitStack()
        self._gpus: list[_Gpu] = []
        self._n_ticks = 0
        self._rows: list[tuple[Any, ...]] = []
        self._stop_evt = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Open NVML, set up GPM where supported and start the sampling thread."""
        if self._started or self._stopped:
            raise RuntimeError("a Sampler can be started only once")
        self._started = True
        reasons: list[str] = []
        if self.gpu_ids:
            self._open_gpus(reasons)
        else:
            reasons.append("no GPUs given: host-only sampling")
        if self._gpm_any() and self.interval_s < GPM_MIN_INTERVAL_S:
            self.interval_s = GPM_MIN_INTERVAL_S
            reasons.append(f"interval raised to {GPM_MIN_INTERVAL_S} s for GPM")
        self.status["interval_s"] = self.interval_s
        self.status["reason"] = "; ".join(reasons) or None
        self._thread = threading.Thread(target=self._run, name="slmserve-telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> pl.DataFrame:
        """Stop and join the thread, release GPM buffers and NVML, and return the frame (idempotent)."""
        if self._stopped:
            return self.frame if self.frame is not None else empty_frame()
        self._stopped = True
        self._stop_evt.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for g in self._gpus:
            if g.gpm is not None:
                g.gpm.close()
        self._nvml_session.close()
        rows, self._rows = self._rows, []
        self.frame = pl.DataFrame(rows, schema=SCHEMA, orient="row") if rows else empty_frame()
        return self.frame

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- setup -------------------------------------------------------------------------------------
    def _open_gpus(self, reasons: list[str]) -> None:
        errors = self.status["field_errors"]
        try:
            nv = self._nvml_session.enter_context(
                nvml.session(self._nvml_arg, on_shutdown_error=lambda exc: _note(errors, "nvmlShutdown", exc))
            )
        except nvml.NvmlUnavailable as exc:
            reasons.append(f"NVML unavailable ({_err(exc.__cause__ or exc)}): host-only sampling")
            return
        metrics: list[_GpmMetrics] = []  # made once, for the first GPU with GPM
        for idx in self.gpu_ids:
            g = _Gpu(nv, idx, errors)
            self._gpus.append(g)
            try:
                g.handle = nv.nvmlDeviceGetHandleByIndex(idx)
            except Exception as exc:
                reasons.append(f"GPU {idx}: no NVML handle ({_err(exc)})")
                continue
            self._open_gpm(g, metrics, reasons)
        self.status["nvml"] = all(g.handle is not None for g in self._gpus)
        self.status["gpm"] = all(g.gpm is not None for g in self._gpus)

    @staticmethod
    def _open_gpm(g: _Gpu, metrics: list[_GpmMetrics], reasons: list[str]) -> None:
        try:
            supported = bool(g.nv.nvmlGpmQueryDeviceSupport(g.handle).isSupportedDevice)
        except Exception as exc:
            reasons.append(f"GPU {g.index}: GPM unavailable ({_err(exc)})")
            return
        if not supported:
            reasons.append(f"GPU {g.index}: GPM not supported (needs Hopper or newer)")
            return
        try:
            if not metrics:
                metrics.append(_GpmMetrics(g.nv))
            g.gpm = _GpmReader(g, metrics[0])
        except Exception as exc:
            reasons.append(f"GPU {g.index}: GPM setup failed ({_err(exc)})")

    def _gpm_any(self) -> bool:
        return any(g.gpm is not None for g in self._gpus)

    # -- the sampling thread -----------------------------------------------------------------------
    def _run(self) -> None:
        # psutil keeps the cpu_percent baseline per thread: prime it here, with the GPM baseline.
        self._cpu_percent()
        for g in self._gpus:
            if g.gpm is not None:
                g.gpm.read()
        min_gap = GPM_MIN_INTERVAL_S if self._gpm_any() else 0.0
        schedule = _Schedule(self.interval_s, min_gap, self._stop_evt)
        while (t_mono := schedule.wait()) is not None:
            try:
                self._tick(t_mono, time.time())
            except Exception as exc:  # never let the thread die; keep sampling
                _note(self.status["field_errors"], "tick", exc)

    def _cpu_percent(self) -> float | None:
        try:
            return float(psutil.cpu_percent(interval=None))
        except Exception as exc:
            _note(self.status["field_errors"], "host.cpu_util_pct", exc)
            return None

    def _tick(self, t_mono: float, t_wall: float) -> None:
        cpu = self._cpu_percent()
        if not self._gpus:
            self._rows.append(_bare_row(t_mono, t_wall, None, cpu))
            return
        read_energy = self._n_ticks % self.energy_every == 0
        self._n_ticks += 1
        for g in self._gpus:
            if g.handle is None:
                self._rows.append(_bare_row(t_mono, t_wall, g.index, cpu))
                continue
            values, gpm_ok = g.read(read_energy)
            self._rows.append((t_mono, t_wall, g.index, *values, cpu, True, gpm_ok))


def host_cpu_times() -> Any | None:
    """The host's cumulative CPU times, all CPUs summed (``psutil.cpu_times()``); None where they cannot be read."""
    try:
        return psutil.cpu_times()
    except Exception:  # host telemetry never fails a run
        return None


_BUSY = ("user", "nice", "system", "irq", "softirq")  # Linux counts a guest's own guests in user and nice


def steal_frac(before: Any | None, after: Any | None) -> float | None:
    """Of the CPU time the guest's CPUs wanted between two :func:`host_cpu_times`, the share the hypervisor
    kept for its own work or other guests: ``d(steal) / (d(steal) + d(user + nice + system + irq + softirq))``
    (Linux ``/proc/stat``, whose user and nice already hold guest and guest_nice). 0 on bare metal, on an
    uncontended VM, and under a hypervisor that does not report steal; a host-bound model slows as it rises.
    None where either reading is missing, the platform has no steal counter, or no CPU time passed."""
    if before is None or after is None or not hasattr(after, "steal"):
        return None
    steal = after.steal - before.steal
    wanted = steal + math.fsum(getattr(after, k, 0.0) - getattr(before, k, 0.0) for k in _BUSY)
    return steal / wanted if wanted > 0 else None


# summary key prefix -> column; "<prefix>_mean" and "<prefix>_max" are reported.
_SUMMARY_METRICS: dict[str, str] = {
    "sm_active": "sm_active_pct",
    "sm_occupancy": "sm_occupancy_pct",
    "dram_bw": "dram_bw_pct",
    "tensor_active": "tensor_active_pct",
    "gpu_util": "gpu_util_pct",
    "sm_clock_mhz": "sm_clock_mhz",
}


def _scalar(value: Any) -> float | None:
    return None if value is None else float(value)


def counter_energy_j(t: np.ndarray, energy_mj: np.ndarray, t_start: float, t_end: float) -> float | None:
    """Energy in joules one GPU used from ``t_start`` to ``t_end``: ``(E(t_end) - E(t_start)) / 1000`` for its
    cumulative counter ``E`` (mJ) read at times ``t`` (sorted), linear between readings and, at most one
    reading interval beyond the first or last reading, continued at the slope of that end interval (the
    sampler's last tick precedes the window's end by up to one interval; the first-to-last difference of the
    readings inside the window would leave out the edges, 5% of a 2 s window at 100 ms ticks). None with
    fewer than two readings, or when an edge lies further beyond them."""
    if len(t) < 2 or t[0] - t_start > t[1] - t[0] or t_end - t[-1] > t[-1] - t[-2]:
        return None

    def at(x: float) -> float:
        i = min(max(int(np.searchsorted(t, x)), 1), len(t) - 1)  # the interval [t[i-1], t[i]] holding x, or the end one
        return float(energy_mj[i - 1] + (energy_mj[i] - energy_mj[i - 1]) * (x - t[i - 1]) / (t[i] - t[i - 1]))

    return (at(t_end) - at(t_start)) / 1000.0


def _fmean(xs: list[float]) -> float | None:
    return math.fsum(xs) / len(xs) if xs else None


def summarize(frame: pl.DataFrame, t_start: float, t_end: float) -> dict[str, Any]:
    """Summarise the samples with ``t_start <= t_mono_s <= t_end`` (monotonic seconds).

    GPU-level metrics are first averaged across the job's GPUs per tick (nulls ignored); ``<m>_mean``
    and ``<m>_max`` are the mean and max of that per-tick series, for ``m`` in sm_active, sm_occupancy,
    dram_bw, tensor_active, gpu_util, sm_clock_mhz. ``power_w_mean`` is the job's total power: the sum
    over GPUs of each GPU's mean power (equal to the mean over ticks of the per-tick sum when no sample
    is missing; null if a GPU has no power reading); ``power_w_mean_per_gpu`` the mean of the per-GPU
    means. ``mem_used_mb_max`` is the max over ticks of the memory used summed over GPUs. ``energy_j``
    comes from the cumulative counter over the whole window, summed over GPUs, in joules
    (:func:`counter_energy_j`; null if a GPU's counter does not cover the window). ``cpu_util_mean`` is
    the mean host CPU utilisation over ticks. A row whose GPM values include a NaN counts as one without GPM values
    (:func:`gpm_valid`). ``n_samples`` counts ticks, ``n_gpus`` distinct GPUs; ``nvml_ok`` and
    ``gpm_ok`` are true when at least one row of the window has NVML (resp. GPM) data.
    """
    w = frame.filter(pl.col("t_mono_s").is_between(t_start, t_end, closed="both")).with_columns(
        pl.when(gpm_valid()).then(pl.col(c)).alias(c) for c in GPM_COLUMNS
    )
    ticks = (
        w.group_by("t_mono_s")
        .agg(
            *[pl.col(col).mean().alias(key) for key, col in _SUMMARY_METRICS.items()],
            pl.when(pl.col("mem_used_mb").count() > 0).then(pl.col("mem_used_mb").sum()).alias("mem"),
            pl.col("cpu_util_pct").mean().alias("cpu"),
        )
        .sort("t_mono_s")
    )  # a fixed order: float sums below come out the same on every re-plot
    out: dict[str, Any] = {}
    for key in _SUMMARY_METRICS:
        out[f"{key}_mean"] = _scalar(ticks[key].mean())
        out[f"{key}_max"] = _scalar(ticks[key].max())

    # exactly rounded sums (math.fsum): a polars mean of a long window changed in its last digits between
    # re-plots (its parallel partial sums), and a re-plot of unchanged results must write the same bytes
    gpus = w.filter(pl.col("gpu").is_not_null()).partition_by("gpu", as_dict=True)
    power = [_fmean(g["power_w"].drop_nulls().to_list()) for _, g in sorted(gpus.items())]
    n_gpus = len(power)
    full_power = n_gpus > 0 and None not in power
    out["power_w_mean"] = math.fsum(power) if full_power else None  # type: ignore[arg-type]
    out["power_w_mean_per_gpu"] = _fmean([p for p in power if p is not None])
    # the counter's readings outside the window too: its edges lie between readings
    used = [k[0] for k in gpus]
    counters = frame.filter(pl.col("gpu").is_in(used) & pl.col("energy_mj").is_not_null())
    energy = [
        counter_energy_j(g["t_mono_s"].to_numpy(), g["energy_mj"].to_numpy(), t_start, t_end)
        for _, g in counters.unique(["gpu", "t_mono_s"]).sort("t_mono_s").group_by("gpu", maintain_order=True)
    ]
    full_energy = n_gpus > 0 and len(energy) == n_gpus and None not in energy
    out["energy_j"] = math.fsum(energy) if full_energy else None
    out["mem_used_mb_max"] = _scalar(ticks["mem"].max())
    out["cpu_util_mean"] = _scalar(ticks["cpu"].mean())
    out["n_samples"] = ticks.height
    out["n_gpus"] = n_gpus
    out["nvml_ok"] = bool(w["nvml_ok"].any()) if w.height else False
    out["gpm_ok"] = bool(w["gpm_ok"].any()) if w.height else False
    return out
