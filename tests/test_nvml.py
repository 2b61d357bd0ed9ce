"""Tests of slmserve.nvml with a fake pynvml module."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from slmserve import nvml


class FakeNvml:
    def __init__(self, n: int = 2, fail_init: bool = False, fail_shutdown: bool = False) -> None:
        self.n, self.fail_init, self.fail_shutdown = n, fail_init, fail_shutdown
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.fail_init:
            raise OSError("no driver")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")
        if self.fail_shutdown:
            raise OSError("shutdown failed")

    def nvmlDeviceGetCount(self) -> int:
        return self.n

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i >= self.n:
            raise IndexError(i)
        return i

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(total=(80 + h) << 30, used=0)

    def nvmlDeviceGetName(self, h: int) -> str:
        return f"GPU model {h}"

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.1"


def test_session_inits_and_shuts_down() -> None:
    fake = FakeNvml()
    with nvml.session(fake) as nv:
        assert nv is fake and fake.calls == ["init"]
    assert fake.calls == ["init", "shutdown"]


def test_session_without_nvml_raises_nvml_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(fail_init=True)
    with pytest.raises(nvml.NvmlUnavailable, match="no driver") as info, nvml.session(fake):
        pass
    assert isinstance(info.value.__cause__, OSError)
    assert fake.calls == ["init"]  # no shutdown without init
    monkeypatch.setitem(sys.modules, "pynvml", None)  # the import fails
    with pytest.raises(nvml.NvmlUnavailable), nvml.session():
        pass


def test_shutdown_error_goes_to_the_callback_not_the_caller() -> None:
    seen: list[Exception] = []
    with nvml.session(FakeNvml(fail_shutdown=True), on_shutdown_error=seen.append):
        pass
    assert [str(e) for e in seen] == ["shutdown failed"]
    with nvml.session(FakeNvml(fail_shutdown=True)):
        pass  # logged only


def test_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(n=2)
    assert nvml.gpu_count(fake) == 2
    assert nvml.total_memory_bytes(1, fake) == 81 << 30
    assert nvml.names_and_driver([1, 0], fake) == (["GPU model 1", "GPU model 0"], "580.1")
    with pytest.raises(IndexError):
        nvml.total_memory_bytes(5, fake)
    assert fake.calls.count("init") == fake.calls.count("shutdown") == 4
    assert nvml.gpu_count(FakeNvml(fail_init=True)) == 0
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(n=3))
    assert nvml.gpu_count() == 3
