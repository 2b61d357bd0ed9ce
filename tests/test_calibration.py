"""Tests for slmserve.machine (the machine's name) and slmserve.calibration (every machine's calibration point)."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

from slmserve import analysis, calibration, stats
from slmserve.machine import machine_id, slug

ROOT = Path(__file__).resolve().parents[1]
POINT = ROOT / "results/quick/runs/opt1.3b/tp1-out256-rateinf/bs256"  # 3 repeats on an H100, 2026-11-23


class FakeNvml(SimpleNamespace):
    """pynvml's calls that machine_id makes, for GPUs of the given (name, UUID)."""

    def __init__(self, gpus: list[tuple[str, str]], fail: bool = False) -> None:
        super().__init__(gpus=gpus, fail=fail)

    def nvmlInit(self) -> None:
        if self.fail:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.gpus[h][0].encode()  # older pynvml returns bytes

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.gpus[h][1]


def test_machine_id_is_the_gpu_model_and_a_hash_of_the_sorted_uuids() -> None:
    a, b = ("NVIDIA H100 80GB HBM3", "GPU-aaaa"), ("NVIDIA H100 80GB HBM3", "GPU-bbbb")
    name = machine_id(FakeNvml([a, b]))
    assert name.startswith("h100-80gb-hbm3-") and len(name.rsplit("-", 1)[1]) == 8
    assert machine_id(FakeNvml([b, a])) == name  # the order NVML lists them in does not matter
    assert machine_id(FakeNvml([a])) != name  # another set of GPUs is another machine
    assert machine_id(FakeNvml([("NVIDIA H200", "GPU-aaaa")])).startswith("h200-")
    assert slug("NVIDIA A100-SXM4-40GB") == "a100-sxm4-40gb" and slug("???") == "gpu"


def test_machine_id_without_nvml_or_gpus_names_the_host() -> None:
    name = machine_id(FakeNvml([], fail=True), hostname="node17")
    assert name.startswith("cpu-") and name == machine_id(FakeNvml([]), hostname="node17")
    assert name != machine_id(FakeNvml([], fail=True), hostname="node18")


def _place(results: Path, machine: str, model: str = "opt1.3b") -> Path:
    target = results / "calibration" / machine / f"{model}.requests.parquet"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(POINT.with_suffix(".requests.parquet"), target)
    shutil.copy(POINT.with_suffix(".telemetry.parquet"), target.with_name(f"{model}.telemetry.parquet"))
    return target


@pytest.mark.skipif(not POINT.with_suffix(".requests.parquet").exists(), reason="results/quick not in this checkout")
def test_table_of_two_machines(tmp_path: Path) -> None:
    """A measured point (OPT-1.3B b=256, n = 3, H100) filed as two machines' calibration: the row says what the
    sweep summary says of that point, with the machine's hardware; the spread between the two is 1."""
    files = [_place(tmp_path, "h100-80gb-hbm3-0000aaaa"), _place(tmp_path, "h100-80gb-hbm3-0000bbbb")]
    frame = calibration.table(files)
    point = analysis.summarize_run(POINT.with_suffix(".requests.parquet"))
    assert frame["machine"].to_list() == ["h100-80gb-hbm3-0000aaaa", "h100-80gb-hbm3-0000bbbb"]
    r = frame.row(0, named=True)
    assert r["n"] == 3 and r["batch_size"] == 256 and r["model"] == "opt1.3b"
    assert r["throughput_rps"] == pytest.approx(point["throughput_rps"])
    assert (r["ci_lo"], r["ci_hi"]) == pytest.approx((point["throughput_rps_ci_lo"], point["throughput_rps_ci_hi"]))
    assert r["cv"] == pytest.approx(point["throughput_rps_sd"] / point["throughput_rps"])
    assert r["gpu_model"] == "NVIDIA H100 80GB HBM3" and r["driver"] == "580.159.04" and r["cpu_cores"] == 16
    sp = calibration.spread(frame)
    assert sp.row(0, named=True)["machines"] == 2 and sp["ratio"].to_list() == [pytest.approx(1.0)]
    md = calibration.to_markdown(frame)
    assert "| h100-80gb-hbm3-0000aaaa | NVIDIA H100 80GB HBM3 (580.159.04) | Intel(R) Xeon(R) Processor (16) |" in md
    assert f"{r['throughput_rps']:.1f} [{r['ci_lo']:.1f}, {r['ci_hi']:.1f}] | 3 |" in md
    assert "- opt1.3b on NVIDIA H100 80GB HBM3: 2 machines" in md and "(highest / lowest 1.000 [" in md
    assert "], not resolved)" in md and '"resolved" where the CI excludes 1' in md
    one = calibration.to_markdown(frame.head(1))
    assert "No model has been calibrated on two machines of one GPU model yet" in one
    # a third machine of another GPU model is no part of the H100s' spread, nor a spread of its own
    h200 = frame.head(1).with_columns(machine=pl.lit("h200-0000cccc"), gpu_model=pl.lit("NVIDIA H200"),
                                      throughput_rps=pl.lit(2 * r["throughput_rps"]))  # fmt: skip
    mixed = pl.concat([frame, h200])
    assert calibration.spread(mixed).select("gpu_model", "machines", "ratio").rows() == [
        ("NVIDIA H100 80GB HBM3", 2, pytest.approx(1.0))]  # fmt: skip
    assert "each line above is one GPU model's" in calibration.to_markdown(mixed)


def test_the_spread_between_machines_carries_the_ci_of_its_two_machines() -> None:
    """Highest over lowest machine mean, with the delta-method CI of those two: 3 machines of one GPU, the
    middle one left out of the ratio; a machine with one repeat gives no CI."""
    frame = pl.DataFrame({"model": ["m"] * 3, "gpu_model": ["G"] * 3, "n": [3, 3, 3],
                          "throughput_rps": [150.9, 115.9, 140.0], "throughput_rps_sd": [20.0, 15.0, 1.0]})  # fmt: skip
    r = calibration.spread(frame).row(0, named=True)
    want = stats.ratio_ci_of({"n": 3, "mean": 150.9, "sd": 20.0}, {"n": 3, "mean": 115.9, "sd": 15.0})
    assert r["machines"] == 3 and r["ratio"] == pytest.approx(150.9 / 115.9)
    assert (r["ratio_ci_lo"], r["ratio_ci_hi"]) == (pytest.approx(want["ci_lo"]), pytest.approx(want["ci_hi"]))
    assert want["ci_lo"] < 1 and calibration._ratio(r).endswith("], not resolved")
    tight = calibration.spread(frame.with_columns(throughput_rps_sd=pl.lit(1.0))).row(0, named=True)
    assert tight["ratio_ci_lo"] > 1 and calibration._ratio(tight).endswith("], resolved")
    single = calibration.spread(frame.with_columns(n=pl.Series([1, 3, 3]))).row(0, named=True)
    assert single["ratio_ci_lo"] is None and calibration._ratio(single) == "1.302, no CI (a machine with one repeat)"


def test_table_names_a_file_that_is_not_a_calibration_point(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a calibration file"):
        calibration.table([tmp_path / "runs/opt1.3b/tp1-out256-rateinf/bs256.requests.parquet"])
    assert calibration.table([]).columns == list(calibration.COLUMNS)
    assert calibration.table([]).schema["throughput_rps"] == pl.Float64
