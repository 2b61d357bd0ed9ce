"""DCGM-style GPU and host telemetry, sampled in a background thread.

:class:`Sampler` reads, every ``interval_s`` (100 ms by default) and for each GPU of the job, through
NVML (the ``nvidia-ml-py`` module ``pynvml``):

============================  ==============================================================================
column                        source
============================  ==============================================================================
``gpu_util_pct``              ``nvmlDeviceGetUtilizationRates(h).gpu`` (% of time a kernel ran)
``mem_used_mb``               ``nvmlDeviceGetMemoryInfo(h).used`` in MiB (2**20 bytes), as nvidia-smi shows it
``power_w``                   ``nvmlDeviceGetPowerUsage(h)`` (milliwatts) / 1000; on Hopper the driver's
                              ~1 s moving average, so it lags load changes (use ``energy_mj`` for windows)
``energy_mj``                 ``nvmlDeviceGetTotalEnergyConsumption(h)``: cumulative millijoules since the
                              driver loaded (a float column; differences give energy over a window).
                              Each read costs ~4 ms of CPU (H200, driver 580; the other reads cost
                              ~0.1 ms together): ``energy_every=N`` reads it every N-th tick only
``sm_clock_mhz``              ``nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)``
``sm_active_pct``             GPM ``NVML_GPM_METRIC_SM_UTIL`` (what DCGM_FI_PROF_SM_ACTIVE reports)
``sm_occupancy_pct``          GPM ``NVML_GPM_METRIC_SM_OCCUPANCY`` (DCGM_FI_PROF_SM_OCCUPANCY)
``dram_bw_pct``               GPM ``NVML_GPM_METRIC_DRAM_BW_UTIL`` (DCGM_FI_PROF_DRAM_ACTIVE)
``tensor_active_pct``         GPM ``NVML_GPM_METRIC_ANY_TENSOR_UTIL`` (any tensor pipe busy)
``cpu_util_pct``              ``psutil.cpu_percent(interval=None)``: system-wide host CPU over the last tick
============================  ==============================================================================

GPM metrics (Hopper or newer) come from two GPM samples: each tick takes a new sample and computes the
metrics against the previous tick's sample, so every GPM value covers exactly the interval that ends at
its row's timestamp. NVML wants the two samples more than 100 ms apart, so with GPM on the interval is
raised to at least 0.1 s (the effective value is ``Sampler.status["interval_s"]``) and a tick that wakes
early relative to the previous GPM sample waits the few missing milliseconds. A baseline (GPM samples
and the CPU counter) is taken when the thread starts; the first row comes one interval later. MIG
instances are not handled (the whole-GPU sample is taken).

GPU ids are physical NVML indices (NVML ignores ``CUDA_VISIBLE_DEVICES``). All GPUs of one tick share
the tick's timestamps. Nothing here raises because telemetry is missing: where NVML or GPM is absent
(CPU machines, older GPUs) or one NVML call fails, the frame keeps the same schema with nulls, the
flags ``nvml_ok``/``gpm_ok`` say what the row holds, and :attr:`Sampler.status` carries the reason. With
no GPUs given, or when NVML cannot be initialised, every tick writes one host row with ``gpu`` null.

The loop is cheap on purpose (it runs beside the measured server): NVML calls and plain tuples only,
the polars frame is built once, in :meth:`Sampler.stop`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import polars as pl
import psutil

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


class _Gpu:
    """Per-GPU state: the NVML handle and the two rolling GPM sample buffers."""

    __slots__ = ("gpm_cur", "gpm_prev", "gpm_primed", "handle", "index")

    def __init__(self, index: int) -> None:
        self.index = index
        self.handle: Any = None
        self.gpm_prev: Any = None
        self.gpm_cur: Any = None
        self.gpm_primed = False


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
        self._n_ticks = 0
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
        self._nv: Any = None
        self._nvml_inited = False
        self._gpus: list[_Gpu] = []
        self._gpm_any = False
        self._mg: Any = None  # the reused c_nvmlGpmMetricsGet_t
        self._gpm_ids: tuple[int, ...] = ()
        self._clock_sm = 1
        self._gpm_version = 1
        self._rows: list[tuple[Any, ...]] = []
        self._stop_evt = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Initialise NVML (once), set up GPM where supported and start the sampling thread."""
        if self._started or self._stopped:
            raise RuntimeError("a Sampler can be started only once")
        self._started = True
        reasons: list[str] = []
        if self.gpu_ids:
            self._init_nvml(reasons)
        else:
            reasons.append("no GPUs given: host-only sampling")
        if self._gpm_any and self.interval_s < GPM_MIN_INTERVAL_S:
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
        self._release()
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

    # -- setup and teardown ------------------------------------------------------------------------
    def _init_nvml(self, reasons: list[str]) -> None:
        try:
            nv = self._nvml_arg
            if nv is None:
                import pynvml as nv  # lazy: CPU-only machines need not have NVML
            nv.nvmlInit()
        except Exception as exc:
            reasons.append(f"NVML unavailable ({_err(exc)}): host-only sampling")
            return
        self._nv = nv
        self._nvml_inited = True
        self._clock_sm = getattr(nv, "NVML_CLOCK_SM", 1)
        self._gpm_ids = tuple(getattr(nv, name, default) for name, default in _GPM_METRICS)
        self._gpm_version = getattr(nv, "NVML_GPM_METRICS_GET_VERSION", 1)
        all_handles = True
        for idx in self.gpu_ids:
            g = _Gpu(idx)
            self._gpus.append(g)
            try:
                g.handle = nv.nvmlDeviceGetHandleByIndex(idx)
            except Exception as exc:
                all_handles = False
                reasons.append(f"GPU {idx}: no NVML handle ({_err(exc)})")
                continue
            self._init_gpm(g, reasons)
        self.status["nvml"] = all_handles
        self.status["gpm"] = all(g.gpm_prev is not None for g in self._gpus)

    def _init_gpm(self, g: _Gpu, reasons: list[str]) -> None:
        nv = self._nv
        try:
            supported = bool(nv.nvmlGpmQueryDeviceSupport(g.handle).isSupportedDevice)
        except Exception as exc:
            reasons.append(f"GPU {g.index}: GPM unavailable ({_err(exc)})")
            return
        if not supported:
            reasons.append(f"GPU {g.index}: GPM not supported (needs Hopper or newer)")
            return
        try:
            if self._mg is None:
                mg = nv.c_nvmlGpmMetricsGet_t()
                self._prepare_metrics_get(mg)
                self._mg = mg
            g.gpm_prev = nv.nvmlGpmSampleAlloc()
            g.gpm_cur = nv.nvmlGpmSampleAlloc()
        except Exception as exc:
            reasons.append(f"GPU {g.index}: GPM setup failed ({_err(exc)})")
            self._free_gpm(g)
            return
        self._gpm_any = True

    def _prepare_metrics_get(self, mg: Any) -> None:
        mg.version = self._gpm_version
        mg.numMetrics = len(self._gpm_ids)
        for i, mid in enumerate(self._gpm_ids):
            mg.metrics[i].metricId = mid

    def _free_gpm(self, g: _Gpu) -> None:
        for attr in ("gpm_prev", "gpm_cur"):
            sample = getattr(g, attr)
            if sample is not None:
                try:
                    self._nv.nvmlGpmSampleFree(sample)
                except Exception as exc:
                    self.status["field_errors"].setdefault(f"gpu{g.index}.gpm_free", _err(exc))
                setattr(g, attr, None)

    def _release(self) -> None:
        if not self._nvml_inited:
            return
        for g in self._gpus:
            self._free_gpm(g)
        try:
            self._nv.nvmlShutdown()
        except Exception as exc:
            self.status["field_errors"].setdefault("nvmlShutdown", _err(exc))
        self._nvml_inited = False

    # -- the sampling thread -----------------------------------------------------------------------
    def _run(self) -> None:
        # psutil keeps the cpu_percent baseline per thread: prime it here, with the GPM baseline.
        self._cpu_percent()
        for g in self._gpus:
            if g.gpm_prev is not None:
                self._gpm_read(g)
        interval = self.interval_s
        t0 = last = time.monotonic()
        k = 1
        evt = self._stop_evt
        while not evt.wait(max(0.0, t0 + k * interval - time.monotonic())):
            if self._gpm_any:
                gap = time.monotonic() - last
                if gap < GPM_MIN_INTERVAL_S and evt.wait(GPM_MIN_INTERVAL_S - gap):
                    break
            last = time.monotonic()
            try:
                self._tick(last, time.time())
            except Exception as exc:  # never let the thread die; keep sampling
                self.status["field_errors"].setdefault("tick", _err(exc))
            # Next point of the fixed grid t0 + k*interval that lies in the future (late ticks are skipped).
            k = max(k + 1, int((time.monotonic() - t0) / interval) + 1)

    def _cpu_percent(self) -> float | None:
        try:
            return float(psutil.cpu_percent(interval=None))
        except Exception as exc:
            self.status["field_errors"].setdefault("host.cpu_util_pct", _err(exc))
            return None

    def _call(self, g: _Gpu, field: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            self.status["field_errors"].setdefault(f"gpu{g.index}.{field}", _err(exc))
            return None

    def _gpm_read(self, g: _Gpu) -> tuple[tuple[float | None, ...], bool]:
        """Take a GPM sample into the spare buffer; compute metrics against the previous one."""
        nv = self._nv
        cur = g.gpm_cur
        try:
            nv.nvmlGpmSampleGet(g.handle, cur)
        except Exception as exc:  # keep the previous sample: the next value covers a longer interval
            self.status["field_errors"].setdefault(f"gpu{g.index}.gpm_sample", _err(exc))
            return _NO_GPM, False
        values: tuple[float | None, ...] = _NO_GPM
        ok = False
        if g.gpm_primed:
            mg = self._mg
            self._prepare_metrics_get(mg)
            mg.sample1 = g.gpm_prev
            mg.sample2 = cur
            try:
                nv.nvmlGpmMetricsGet(mg)
                values = tuple(
                    float(m.value) if m.nvmlReturn == 0 else None
                    for m in (mg.metrics[i] for i in range(len(self._gpm_ids)))
                )
                ok = True
            except Exception as exc:
                self.status["field_errors"].setdefault(f"gpu{g.index}.gpm_metrics", _err(exc))
        g.gpm_prev, g.gpm_cur = cur, g.gpm_prev
        g.gpm_primed = True
        return values, ok

    def _tick(self, t_mono: float, t_wall: float) -> None:
        cpu = self._cpu_percent()
        rows = self._rows
        if not self._gpus:
            rows.append(_bare_row(t_mono, t_wall, None, cpu))
            return
        nv = self._nv
        call = self._call
        read_energy = self._n_ticks % self.energy_every == 0
        self._n_ticks += 1
        for g in self._gpus:
            h = g.handle
            if h is None:
                rows.append(_bare_row(t_mono, t_wall, g.index, cpu))
                continue
            gpm, gpm_ok = self._gpm_read(g) if g.gpm_prev is not None else (_NO_GPM, False)
            util = call(g, "gpu_util_pct", nv.nvmlDeviceGetUtilizationRates, h)
            mem = call(g, "mem_used_mb", nv.nvmlDeviceGetMemoryInfo, h)
            power = call(g, "power_w", nv.nvmlDeviceGetPowerUsage, h)
            energy = call(g, "energy_mj", nv.nvmlDeviceGetTotalEnergyConsumption, h) if read_energy else None
            clock = call(g, "sm_clock_mhz", nv.nvmlDeviceGetClockInfo, h, self._clock_sm)
            rows.append(
                (
                    t_mono,
                    t_wall,
                    g.index,
                    None if util is None else float(util.gpu),
                    None if mem is None else mem.used / _MIB,
                    None if power is None else power / 1000.0,
                    None if energy is None else float(energy),
                    None if clock is None else float(clock),
                    *gpm,
                    cpu,
                    True,
                    gpm_ok,
                )
            )


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


def summarize(frame: pl.DataFrame, t_start: float, t_end: float) -> dict[str, Any]:
    """Summarise the samples with ``t_start <= t_mono_s <= t_end`` (monotonic seconds).

    GPU-level metrics are first averaged across the job's GPUs per tick (nulls ignored); ``<m>_mean``
    and ``<m>_max`` are the mean and max of that per-tick series, for ``m`` in sm_active, sm_occupancy,
    dram_bw, tensor_active, gpu_util, sm_clock_mhz. ``power_w_mean`` is the job's total power: the sum
    over GPUs of each GPU's mean power (equal to the mean over ticks of the per-tick sum when no sample
    is missing; null if a GPU has no power reading); ``power_w_mean_per_gpu`` the mean of the per-GPU
    means. ``mem_used_mb_max`` is the max over ticks of the memory used summed over GPUs. ``energy_j``
    comes from the cumulative counter: per GPU, last minus first reading in the window, summed over
    GPUs, in joules (null if a GPU has no counter reading). ``cpu_util_mean`` is the mean host CPU
    utilisation over ticks. ``n_samples`` counts ticks, ``n_gpus`` distinct GPUs; ``nvml_ok`` and
    ``gpm_ok`` are true when at least one row of the window has NVML (resp. GPM) data.
    """
    w = frame.filter(pl.col("t_mono_s").is_between(t_start, t_end, closed="both"))
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

    per_gpu = (
        w.filter(pl.col("gpu").is_not_null())
        .group_by("gpu")
        .agg(
            pl.col("power_w").mean().alias("power"),
            pl.col("energy_mj").sort_by("t_mono_s").drop_nulls().alias("energy"),
        )
        .with_columns((pl.col("energy").list.last() - pl.col("energy").list.first()).alias("energy"))
        .sort("gpu")
    )
    n_gpus = per_gpu.height
    power = per_gpu["power"]
    energy = per_gpu["energy"]
    full_power = n_gpus > 0 and power.null_count() == 0
    out["power_w_mean"] = _scalar(power.sum()) if full_power else None
    out["power_w_mean_per_gpu"] = _scalar(power.mean())
    full_energy = n_gpus > 0 and energy.null_count() == 0
    out["energy_j"] = float(energy.sum()) / 1000.0 if full_energy else None
    out["mem_used_mb_max"] = _scalar(ticks["mem"].max())
    out["cpu_util_mean"] = _scalar(ticks["cpu"].mean())
    out["n_samples"] = ticks.height
    out["n_gpus"] = n_gpus
    out["nvml_ok"] = bool(w["nvml_ok"].any()) if w.height else False
    out["gpm_ok"] = bool(w["gpm_ok"].any()) if w.height else False
    return out
