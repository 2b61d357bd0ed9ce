"""Tests for slmserve.telemetry: a fake NVML module drives the sampler deterministically."""

from __future__ import annotations

import math
import threading
import time
from types import SimpleNamespace
from typing import Any

import polars as pl
import pytest

from slmserve.telemetry import SCHEMA, Sampler, empty_frame, summarize

GPM_COLS = ["sm_active_pct", "sm_occupancy_pct", "dram_bw_pct", "tensor_active_pct"]
# metric id -> value on GPU 0 (GPU i adds i)
GPM_VALUES = {2: 10.0, 3: 20.0, 10: 30.0, 5: 40.0}


class FakeNVMLError(Exception):
    pass


class FakeSample:
    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.gpu: int | None = None
        self.seq = -1


class FakeMetricsGet:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: FakeSample | None = None
        self.sample2: FakeSample | None = None
        self.metrics = [SimpleNamespace(metricId=-1, nvmlReturn=-1, value=0.0) for _ in range(8)]


class FakeNvml:
    """The subset of pynvml's API that the sampler uses, with deterministic values per GPU."""

    NVMLError = FakeNVMLError
    NVML_CLOCK_SM = 1
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_GPM_METRIC_SM_OCCUPANCY = 3
    NVML_GPM_METRIC_DRAM_BW_UTIL = 10
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
    NVML_GPM_METRICS_GET_VERSION = 1
    c_nvmlGpmMetricsGet_t = FakeMetricsGet

    def __init__(
        self, n_gpus: int = 2, gpm: bool = True, fail: tuple[str, ...] = (), nan_at: int | None = None
    ) -> None:
        self.n_gpus = n_gpus
        self.nan_at = nan_at  # GPM interval (its second sample's seq) answered as the H100 did: zeros, DRAM NaN
        self.gpm = gpm
        self.fail = set(fail)
        self.init_calls = 0
        self.shutdown_calls = 0
        self.energy = [0] * n_gpus
        self.seq = [0] * n_gpus
        self.allocated: list[FakeSample] = []
        self.freed: list[FakeSample] = []
        self.pairs: list[tuple[int, int, int]] = []  # (gpu, seq of sample1, seq of sample2)

    def _check(self, name: str) -> None:
        if name in self.fail:
            raise FakeNVMLError(f"{name} failed")

    def nvmlInit(self) -> None:
        self._check("nvmlInit")
        self.init_calls += 1

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimpleNamespace:
        self._check(f"nvmlDeviceGetHandleByIndex:{index}")
        if index >= self.n_gpus:
            raise FakeNVMLError("Invalid Argument")
        return SimpleNamespace(index=index)

    def nvmlDeviceGetUtilizationRates(self, h: SimpleNamespace) -> SimpleNamespace:
        self._check("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=50 + h.index, memory=7)

    def nvmlDeviceGetMemoryInfo(self, h: SimpleNamespace) -> SimpleNamespace:
        self._check("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=80 << 30, free=1, used=(1000 + h.index) << 20)

    def nvmlDeviceGetPowerUsage(self, h: SimpleNamespace) -> int:
        self._check("nvmlDeviceGetPowerUsage")
        return 150_500 + 1000 * h.index  # milliwatts

    def nvmlDeviceGetTotalEnergyConsumption(self, h: SimpleNamespace) -> int:
        self._check("nvmlDeviceGetTotalEnergyConsumption")
        self.energy[h.index] += 1000
        return self.energy[h.index]

    def nvmlDeviceGetClockInfo(self, h: SimpleNamespace, clock_type: int) -> int:
        self._check("nvmlDeviceGetClockInfo")
        assert clock_type == self.NVML_CLOCK_SM
        return 1980 - h.index

    def nvmlGpmQueryDeviceSupport(self, h: SimpleNamespace) -> SimpleNamespace:
        self._check("nvmlGpmQueryDeviceSupport")
        return SimpleNamespace(version=1, isSupportedDevice=int(self.gpm))

    def nvmlGpmSampleAlloc(self) -> FakeSample:
        self._check("nvmlGpmSampleAlloc")
        sample = FakeSample(len(self.allocated))
        self.allocated.append(sample)
        return sample

    def nvmlGpmSampleFree(self, sample: FakeSample) -> None:
        self.freed.append(sample)

    def nvmlGpmSampleGet(self, h: SimpleNamespace, sample: FakeSample) -> FakeSample:
        self._check("nvmlGpmSampleGet")
        assert sample not in self.freed
        sample.gpu = h.index
        sample.seq = self.seq[h.index]
        self.seq[h.index] += 1
        return sample

    def nvmlGpmMetricsGet(self, mg: FakeMetricsGet) -> FakeMetricsGet:
        self._check("nvmlGpmMetricsGet")
        assert mg.version == 1
        s1, s2 = mg.sample1, mg.sample2
        assert s1 is not None and s2 is not None and s1 is not s2 and s1.gpu == s2.gpu
        self.pairs.append((s1.gpu, s1.seq, s2.seq))
        for m in mg.metrics[: mg.numMetrics]:
            m.value = GPM_VALUES[m.metricId] + s1.gpu
            if s2.seq == self.nan_at:
                m.value = math.nan if m.metricId == self.NVML_GPM_METRIC_DRAM_BW_UTIL else 0.0
            m.nvmlReturn = 0
        return mg


def run_sampler(sampler: Sampler, seconds: float) -> pl.DataFrame:
    with sampler:
        time.sleep(seconds)
    assert sampler.frame is not None
    return sampler.frame


def no_telemetry_thread() -> bool:
    return all(t.name != "slmserve-telemetry" for t in threading.enumerate())


def test_schema_and_empty_frame() -> None:
    assert list(SCHEMA) == [
        "t_mono_s",
        "t_wall_s",
        "gpu",
        "gpu_util_pct",
        "mem_used_mb",
        "power_w",
        "energy_mj",
        "sm_clock_mhz",
        *GPM_COLS,
        "cpu_util_pct",
        "nvml_ok",
        "gpm_ok",
    ]
    frame = empty_frame()
    assert frame.height == 0
    assert frame.schema == pl.Schema(SCHEMA)
    assert frame["gpu"].dtype == pl.Int32


def test_fake_nvml_with_gpm_values_and_rolling_samples() -> None:
    fake = FakeNvml(n_gpus=2)
    sampler = Sampler([0, 1], interval_s=0.1, nvml=fake)
    frame = run_sampler(sampler, 0.45)

    assert frame.schema == pl.Schema(SCHEMA)
    assert sampler.status["nvml"] is True
    assert sampler.status["gpm"] is True
    assert sampler.status["reason"] is None
    assert sampler.status["field_errors"] == {}
    # rows per GPU per tick: every tick has exactly GPU 0 and GPU 1, sharing the timestamps
    per_tick = frame.group_by("t_mono_s").agg(pl.col("gpu").sort(), pl.col("t_wall_s").n_unique())
    assert per_tick.height >= 2
    assert per_tick["gpu"].to_list() == [[0, 1]] * per_tick.height
    assert per_tick["t_wall_s"].to_list() == [1] * per_tick.height
    assert frame["t_mono_s"].is_sorted()

    for gpu in (0, 1):
        g = frame.filter(pl.col("gpu") == gpu)
        assert g["gpu_util_pct"].to_list() == [50.0 + gpu] * g.height
        assert g["mem_used_mb"].to_list() == [1000.0 + gpu] * g.height
        assert g["power_w"].to_list() == [150.5 + gpu] * g.height  # mW -> W
        assert g["sm_clock_mhz"].to_list() == [1980.0 - gpu] * g.height
        assert g["sm_active_pct"].to_list() == [10.0 + gpu] * g.height
        assert g["sm_occupancy_pct"].to_list() == [20.0 + gpu] * g.height
        assert g["dram_bw_pct"].to_list() == [30.0 + gpu] * g.height
        assert g["tensor_active_pct"].to_list() == [40.0 + gpu] * g.height
        # the cumulative counter: one read per tick, 1000 mJ more each time
        assert g["energy_mj"].to_list() == [1000.0 * (i + 1) for i in range(g.height)]
        assert g["cpu_util_pct"].null_count() == 0
        assert g["nvml_ok"].all() and g["gpm_ok"].all()

    # rolling GPM samples: baseline at start, then each value from the previous tick's sample to the new one
    for gpu in (0, 1):
        pairs = [(s1, s2) for g, s1, s2 in fake.pairs if g == gpu]
        assert pairs == [(i, i + 1) for i in range(len(pairs))]
        assert len(pairs) == frame.filter(pl.col("gpu") == gpu).height
    # NVML once, GPM buffers (two per GPU) all freed
    assert fake.init_calls == 1 and fake.shutdown_calls == 1
    assert len(fake.allocated) == 4
    assert sorted(s.ident for s in fake.freed) == [0, 1, 2, 3]
    assert no_telemetry_thread()


def test_degenerate_gpm_interval_gives_a_null_row() -> None:
    """NVML's answer to a degenerate GPM interval on the H100 (SM, occupancy, tensor 0 and DRAM NaN while the
    GPU is busy) is no reading: that row's GPM columns are null and gpm_ok false, the others keep theirs."""
    fake = FakeNvml(n_gpus=1, nan_at=2)
    sampler = Sampler([0], interval_s=0.1, nvml=fake)
    frame = run_sampler(sampler, 0.45)
    assert frame.height >= 3
    bad = frame.row(1, named=True)  # the interval from sample 1 to sample 2
    assert all(bad[c] is None for c in GPM_COLS) and bad["gpm_ok"] is False
    assert bad["power_w"] is not None and bad["nvml_ok"] is True
    good = frame.filter(pl.int_range(pl.len()) != 1)
    assert good["gpm_ok"].all() and good["dram_bw_pct"].to_list() == [30.0] * good.height
    assert "NaN" in sampler.status["field_errors"]["gpu0.gpm_metrics"].replace("nan", "NaN")


def test_summarize_ignores_gpm_rows_with_a_nan() -> None:
    """Results recorded before the sampler nulled such rows hold the zeros and the NaN: the summary leaves
    that row's GPM values out (a NaN mean before), and keeps its power."""
    rows = [_gpu_row(float(t), 0, sm_active_pct=50.0, sm_occupancy_pct=20.0, dram_bw_pct=40.0,
                     tensor_active_pct=10.0, power_w=100.0 * t) for t in (1, 2, 3)]  # fmt: skip
    rows[1].update(sm_active_pct=0.0, sm_occupancy_pct=0.0, dram_bw_pct=math.nan, tensor_active_pct=0.0)
    s = summarize(_frame(rows), 1.0, 3.0)
    assert s["dram_bw_mean"] == pytest.approx(40.0) and s["dram_bw_max"] == pytest.approx(40.0)
    assert s["sm_active_mean"] == pytest.approx(50.0) and s["tensor_active_mean"] == pytest.approx(10.0)
    assert s["power_w_mean"] == pytest.approx(200.0) and s["n_samples"] == 3


def test_energy_every_nth_tick() -> None:
    fake = FakeNvml(n_gpus=1, gpm=False)
    frame = run_sampler(Sampler([0], interval_s=0.02, nvml=fake, energy_every=3), 0.2)
    assert frame.height >= 4
    energy = frame["energy_mj"].to_list()
    assert energy[0::3] == [1000.0 * (i + 1) for i in range(len(energy[0::3]))]
    assert all(e is None for i, e in enumerate(energy) if i % 3)
    assert frame["power_w"].null_count() == 0
    with pytest.raises(ValueError):
        Sampler([0], energy_every=0)


def test_gpm_clamps_interval_to_100ms() -> None:
    sampler = Sampler([0], interval_s=0.02, nvml=FakeNvml(n_gpus=1))
    frame = run_sampler(sampler, 0.35)
    assert sampler.status["interval_s"] == pytest.approx(0.1)
    assert "interval raised" in sampler.status["reason"]
    gaps = frame["t_mono_s"].diff().drop_nulls()
    assert frame.height >= 2
    assert gaps.min() >= 0.1 - 1e-3


def test_gpm_unsupported_gives_null_gpm_columns() -> None:
    fake = FakeNvml(n_gpus=1, gpm=False)
    sampler = Sampler([0], interval_s=0.02, nvml=fake)
    frame = run_sampler(sampler, 0.15)
    assert frame.height >= 2
    assert sampler.status["interval_s"] == pytest.approx(0.02)  # no GPM, no clamp
    assert sampler.status["nvml"] is True and sampler.status["gpm"] is False
    assert "GPM not supported" in sampler.status["reason"]
    for col in GPM_COLS:
        assert frame[col].null_count() == frame.height
    assert not frame["gpm_ok"].any()
    assert frame["nvml_ok"].all()
    for col in ("gpu_util_pct", "mem_used_mb", "power_w", "energy_mj", "sm_clock_mhz", "cpu_util_pct"):
        assert frame[col].null_count() == 0, col
    assert frame["power_w"].to_list() == [150.5] * frame.height
    assert fake.allocated == []


@pytest.mark.parametrize(
    ("failing", "null_cols", "gpm"),
    [
        ("nvmlDeviceGetPowerUsage", ["power_w"], False),
        ("nvmlDeviceGetTotalEnergyConsumption", ["energy_mj"], False),
        ("nvmlDeviceGetUtilizationRates", ["gpu_util_pct"], False),
        ("nvmlDeviceGetClockInfo", ["sm_clock_mhz"], False),
        ("nvmlGpmMetricsGet", GPM_COLS, True),
        ("nvmlGpmSampleGet", GPM_COLS, True),
    ],
)
def test_one_failing_call_gives_nulls_not_a_crash(failing: str, null_cols: list[str], gpm: bool) -> None:
    fake = FakeNvml(n_gpus=1, gpm=gpm, fail=(failing,))
    sampler = Sampler([0], interval_s=0.1 if gpm else 0.02, nvml=fake)
    frame = run_sampler(sampler, 0.3 if gpm else 0.15)
    assert frame.height >= 2
    assert frame["nvml_ok"].all()
    assert not frame["gpm_ok"].any()
    data_cols = ["gpu_util_pct", "mem_used_mb", "power_w", "energy_mj", "sm_clock_mhz", "cpu_util_pct"]
    for col in data_cols + GPM_COLS:
        expected_nulls = frame.height if (col in null_cols or (col in GPM_COLS and not gpm)) else 0
        assert frame[col].null_count() == expected_nulls, col
    assert len(sampler.status["field_errors"]) == 1
    (msg,) = sampler.status["field_errors"].values()
    assert "FakeNVMLError" in msg and failing in msg
    assert fake.shutdown_calls == 1
    assert no_telemetry_thread()


def test_nvml_init_failure_gives_host_rows() -> None:
    fake = FakeNvml(fail=("nvmlInit",))
    sampler = Sampler([0, 1], interval_s=0.02, nvml=fake)
    frame = run_sampler(sampler, 0.15)
    assert frame.height >= 2
    assert frame["gpu"].null_count() == frame.height  # one host row per tick
    assert frame["t_mono_s"].n_unique() == frame.height
    assert frame["cpu_util_pct"].null_count() == 0
    assert not frame["nvml_ok"].any() and not frame["gpm_ok"].any()
    assert sampler.status == {
        "nvml": False,
        "gpm": False,
        "reason": "NVML unavailable (FakeNVMLError: nvmlInit failed): host-only sampling",
        "interval_s": 0.02,
        "field_errors": {},
    }
    assert fake.shutdown_calls == 0


def test_missing_gpu_handle_gives_null_rows_for_that_gpu() -> None:
    fake = FakeNvml(n_gpus=1, gpm=False)
    sampler = Sampler([0, 5], interval_s=0.02, nvml=fake)
    frame = run_sampler(sampler, 0.15)
    good, bad = frame.filter(pl.col("gpu") == 0), frame.filter(pl.col("gpu") == 5)
    assert good.height >= 2 and bad.height == good.height
    assert good["nvml_ok"].all() and good["power_w"].null_count() == 0
    assert not bad["nvml_ok"].any()
    for col in ("gpu_util_pct", "mem_used_mb", "power_w", "energy_mj", "sm_clock_mhz"):
        assert bad[col].null_count() == bad.height
    assert bad["cpu_util_pct"].null_count() == 0
    assert sampler.status["nvml"] is False
    assert "GPU 5: no NVML handle" in sampler.status["reason"]


def test_no_gpus_given_is_host_only() -> None:
    sampler = Sampler([], interval_s=0.02)
    frame = run_sampler(sampler, 0.15)
    assert frame.height >= 2
    assert frame["gpu"].null_count() == frame.height
    assert frame["cpu_util_pct"].null_count() == 0
    assert sampler.status["reason"] == "no GPUs given: host-only sampling"


def test_real_machine_sampler() -> None:
    """On a machine without NVML (like CI) this gives host rows; on a GPU host, rows for GPU 0."""
    sampler = Sampler([0], interval_s=0.02)
    frame = run_sampler(sampler, 0.3)
    assert frame.height >= 2
    assert frame.schema == pl.Schema(SCHEMA)
    assert frame["cpu_util_pct"].null_count() == 0
    assert frame["t_wall_s"].min() > 1.6e9
    if not sampler.status["nvml"]:
        assert frame["gpu"].null_count() == frame.height
        assert not frame["nvml_ok"].any()
        assert sampler.status["reason"].startswith("NVML unavailable")
        for col in ("gpu_util_pct", "power_w", "energy_mj", *GPM_COLS):
            assert frame[col].null_count() == frame.height
    else:
        assert frame["gpu"].to_list() == [0] * frame.height
        assert frame["nvml_ok"].all()
        assert frame["power_w"].null_count() == 0
    assert no_telemetry_thread()


def test_stop_is_idempotent_and_thread_is_gone() -> None:
    sampler = Sampler([], interval_s=0.02)
    sampler.start()
    assert not no_telemetry_thread()
    time.sleep(0.1)
    first = sampler.stop()
    assert no_telemetry_thread()
    second = sampler.stop()
    assert second is first and sampler.frame is first
    with pytest.raises(RuntimeError):
        sampler.start()
    # stop without start: an empty frame, nothing started
    never = Sampler([0], nvml=FakeNvml())
    assert never.stop().height == 0
    assert never.stop().schema == pl.Schema(SCHEMA)


def test_invalid_interval() -> None:
    with pytest.raises(ValueError):
        Sampler([0], interval_s=0)


def test_sampler_uses_only_names_pynvml_has() -> None:
    pynvml = pytest.importorskip("pynvml")
    used = [name for name in dir(FakeNvml) if name.startswith(("nvml", "NVML", "c_nvml"))]
    assert len(used) > 15
    for name in used:
        assert hasattr(pynvml, name), name
        if name.startswith("NVML_"):
            assert getattr(pynvml, name) == getattr(FakeNvml, name), name
    # the real ctypes struct takes what the sampler writes into it
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = 4
    mg.sample1 = pynvml.c_nvmlGpmSample_t()
    mg.sample2 = pynvml.c_nvmlGpmSample_t()
    for i, mid in enumerate(GPM_VALUES):
        mg.metrics[i].metricId = mid
    assert [mg.metrics[i].metricId for i in range(4)] == [2, 3, 10, 5]
    assert mg.metrics[0].nvmlReturn == 0 and mg.metrics[0].value == 0.0


def _frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    full = [{col: row.get(col) for col in SCHEMA} for row in rows]
    return pl.DataFrame(full, schema=SCHEMA)


def _gpu_row(t: float, gpu: int, **values: Any) -> dict[str, Any]:
    return {"t_mono_s": t, "t_wall_s": 1e9 + t, "gpu": gpu, "nvml_ok": True, "gpm_ok": True, **values}


def test_summarize_exact_values() -> None:
    rows = []
    # ticks at t=1, 2, 3 inside the window [1, 3]; t=0 and t=4 outside with wild values
    ticks = {
        # t: (gpu0, gpu1, cpu)
        1.0: (
            dict(sm_active_pct=10, sm_occupancy_pct=5, dram_bw_pct=1, tensor_active_pct=0, gpu_util_pct=90,
                 sm_clock_mhz=1900, power_w=100, energy_mj=1000, mem_used_mb=1000),
            dict(sm_active_pct=30, sm_occupancy_pct=15, dram_bw_pct=3, tensor_active_pct=20, gpu_util_pct=100,
                 sm_clock_mhz=1980, power_w=50, energy_mj=500, mem_used_mb=500),
            10.0,
        ),
        2.0: (
            dict(sm_active_pct=20, sm_occupancy_pct=10, dram_bw_pct=2, tensor_active_pct=10, gpu_util_pct=100,
                 sm_clock_mhz=1900, power_w=200, energy_mj=2000, mem_used_mb=2000),
            dict(sm_active_pct=40, sm_occupancy_pct=20, dram_bw_pct=4, tensor_active_pct=30, gpu_util_pct=100,
                 sm_clock_mhz=1980, power_w=50, energy_mj=1000, mem_used_mb=500),
            20.0,
        ),
        3.0: (
            dict(sm_active_pct=30, sm_occupancy_pct=15, dram_bw_pct=3, tensor_active_pct=20, gpu_util_pct=100,
                 sm_clock_mhz=1900, power_w=300, energy_mj=3000, mem_used_mb=1500),
            dict(sm_active_pct=50, sm_occupancy_pct=25, dram_bw_pct=5, tensor_active_pct=40, gpu_util_pct=100,
                 sm_clock_mhz=1980, power_w=50, energy_mj=1500, mem_used_mb=3000),
            60.0,
        ),
    }  # fmt: skip
    for t, (g0, g1, cpu) in ticks.items():
        rows.append(_gpu_row(t, 0, cpu_util_pct=cpu, **g0))
        rows.append(_gpu_row(t, 1, cpu_util_pct=cpu, **g1))
    for t in (0.0, 4.0):
        wild = dict(sm_active_pct=100, power_w=999, energy_mj=1e9 * (t + 1), mem_used_mb=1e6, cpu_util_pct=100)
        rows.append(_gpu_row(t, 0, **wild))
        rows.append(_gpu_row(t, 1, **wild))
    s = summarize(_frame(rows), 1.0, 3.0)

    assert s["n_samples"] == 3 and s["n_gpus"] == 2
    # per-tick across-GPU means: sm_active 20, 30, 40
    assert s["sm_active_mean"] == pytest.approx(30.0)
    assert s["sm_active_max"] == pytest.approx(40.0)
    assert s["sm_occupancy_mean"] == pytest.approx(15.0)
    assert s["sm_occupancy_max"] == pytest.approx(20.0)
    assert s["dram_bw_mean"] == pytest.approx(3.0)
    assert s["dram_bw_max"] == pytest.approx(4.0)
    assert s["tensor_active_mean"] == pytest.approx(20.0)
    assert s["tensor_active_max"] == pytest.approx(30.0)
    assert s["gpu_util_mean"] == pytest.approx(295 / 3)  # ticks: 95, 100, 100
    assert s["gpu_util_max"] == pytest.approx(100.0)
    assert s["sm_clock_mhz_mean"] == pytest.approx(1940.0)
    assert s["sm_clock_mhz_max"] == pytest.approx(1940.0)
    # power: gpu0 mean 200 W, gpu1 50 W -> job 250 W, 125 W per GPU
    assert s["power_w_mean"] == pytest.approx(250.0)
    assert s["power_w_mean_per_gpu"] == pytest.approx(125.0)
    # energy: gpu0 1000 -> 3000 mJ = 2 J, gpu1 500 -> 1500 mJ = 1 J
    assert s["energy_j"] == pytest.approx(3.0)
    # memory summed over GPUs per tick: 1500, 2500, 4500
    assert s["mem_used_mb_max"] == pytest.approx(4500.0)
    assert s["cpu_util_mean"] == pytest.approx(30.0)
    assert s["nvml_ok"] is True and s["gpm_ok"] is True


def test_summarize_single_gpu_energy_and_missing_counter() -> None:
    rows = [_gpu_row(float(t), 0, energy_mj=e, power_w=100.0) for t, e in ((1, 1000.0), (2, 2000.0), (3, 3000.0))]
    assert summarize(_frame(rows), 1.0, 3.0)["energy_j"] == pytest.approx(2.0)
    assert summarize(_frame(rows), 1.5, 3.0)["energy_j"] == pytest.approx(1.5)  # E(1.5) is read between ticks
    no_counter = [_gpu_row(float(t), 0, power_w=100.0, gpm_ok=False) for t in (1, 2)]
    s = summarize(_frame(no_counter), 0.0, 5.0)
    assert s["energy_j"] is None
    assert s["power_w_mean"] == pytest.approx(100.0)
    assert s["sm_active_mean"] is None and s["gpm_ok"] is False and s["nvml_ok"] is True


def test_summarize_energy_covers_the_window_between_and_beyond_the_ticks() -> None:
    # 100 W from counter readings at 0.05 + 0.1 k: the window [0, 2] used 200 J, not the 190 J of the
    # readings' first-to-last difference
    ticks = [0.05 + 0.1 * k for k in range(20)]
    rows = [_gpu_row(t, 0, energy_mj=100_000.0 * t, power_w=100.0) for t in ticks]
    assert summarize(_frame(rows), 0.0, 2.0)["energy_j"] == pytest.approx(200.0)
    # the reading before the window's start counts for that edge: E(0.9) = 45 J, E(1.1) = 65 J -> E(1.02) = 57 J
    # by interpolation, and E(1.5) = 125 J: 68 J where the readings inside the window alone give 60 J
    step = [_gpu_row(t, 0, energy_mj=e) for t, e in ((0.9, 45e3), (1.1, 65e3), (1.3, 95e3), (1.5, 125e3))]
    assert summarize(_frame(step), 1.02, 1.5)["energy_j"] == pytest.approx(68.0)
    # an edge more than a reading interval beyond the readings has no energy
    assert summarize(_frame(rows), 0.0, 2.5)["energy_j"] is None
    assert summarize(_frame(rows), -0.2, 1.0)["energy_j"] is None


def test_summarize_host_only_and_empty_window() -> None:
    rows = [
        {"t_mono_s": float(t), "t_wall_s": 1e9, "cpu_util_pct": c, "nvml_ok": False, "gpm_ok": False}
        for t, c in ((1, 10.0), (2, 30.0))
    ]
    s = summarize(_frame(rows), 0.0, 5.0)
    assert s["cpu_util_mean"] == pytest.approx(20.0)
    assert s["n_samples"] == 2 and s["n_gpus"] == 0
    for key in ("sm_active_mean", "power_w_mean", "power_w_mean_per_gpu", "energy_j", "mem_used_mb_max"):
        assert s[key] is None, key
    assert s["nvml_ok"] is False and s["gpm_ok"] is False
    empty = summarize(_frame(rows), 10.0, 20.0)
    assert empty["n_samples"] == 0 and empty["cpu_util_mean"] is None and empty["energy_j"] is None
    assert summarize(empty_frame(), 0.0, 1.0)["n_samples"] == 0


def test_mean_power_is_exactly_rounded_so_a_replot_writes_the_same_bytes() -> None:
    """The mean power of a window is an exactly rounded sum (math.fsum) over the GPU's samples: the same
    value whatever order a parallel sum takes them in (polars' mean of a 10,578-sample window changed in its
    last digits between two re-plots of unchanged results). Samples whose naive sum loses the small terms:"""
    powers = [1e16, 1.0, -1e16, 1.0, 3.0, 1e16, -1e16, 2.0]
    rows = [_gpu_row(float(t), 0, power_w=p) for t, p in enumerate(powers)]
    rows += [_gpu_row(float(t), 1, power_w=10.0) for t in range(len(powers))]
    s = summarize(_frame(rows), 0.0, float(len(powers)))
    assert s["power_w_mean_per_gpu"] == (7.0 / 8 + 10.0) / 2 and s["power_w_mean"] == 7.0 / 8 + 10.0
