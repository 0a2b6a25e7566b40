"""GPU headroom from NVML: unknown (never an error) without a driver, and the per-GPU reading.

This machine has no NVIDIA driver, so the real ``pynvml`` is exercised for its "absent" path. The
per-GPU logic is exercised through a stand-in for the ``pynvml`` *module* (a third-party library),
with the same function names and error behaviour.
"""

from __future__ import annotations

from types import SimpleNamespace

from gateway.control.observation import GpuHeadroom
from gateway.telemetry.nvml import RETRY_INIT_EVERY, FakeGpuSource, GpuSource, NvmlSource


class NVMLError(Exception):
    pass


class FakePynvml:
    """The part of ``pynvml`` the source calls, for a machine with ``gpus`` (total, free, util or None)."""

    def __init__(self, gpus: list[tuple[int, int, int | None]], *, init_error: Exception | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.gpus):
            raise NVMLError("invalid argument")
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        total, free, _ = self.gpus[handle]
        return SimpleNamespace(total=total, free=free, used=total - free)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        util = self.gpus[handle][2]
        if util is None:
            raise NVMLError("not supported")
        return SimpleNamespace(gpu=util, memory=0)

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return f"GPU {handle}".encode()


def test_the_real_nvml_on_a_machine_without_a_driver_reads_as_unknown() -> None:
    source = NvmlSource()
    for _ in range(3):
        assert source.read() == []
    assert source.reason is not None and "NVML" in source.reason
    source.close()


def test_every_visible_gpu_is_read() -> None:
    nvml = FakePynvml([(80 * 2**30, 20 * 2**30, 35), (80 * 2**30, 60 * 2**30, None)])
    source = NvmlSource(nvml=nvml)
    gpus = source.read()
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].memory_free_ratio == 0.25 and gpus[0].utilization == 0.35 and gpus[0].name == "GPU 0"
    assert gpus[1].utilization is None  # not supported (MIG, some boards): unknown, not an error
    assert source.reason is None
    source.close()
    assert nvml.shutdowns == 1


def test_a_configured_set_of_gpus_and_a_missing_index() -> None:
    nvml = FakePynvml([(100, 50, 10), (100, 10, 90), (100, 90, 0)])
    source = NvmlSource([2, 5], nvml=nvml)
    assert [g.index for g in source.read()] == [2]
    assert source.reason is not None and "[5]" in source.reason


def test_a_failing_driver_is_retried_now_and_then_not_on_every_read() -> None:
    nvml = FakePynvml([(100, 50, 10)], init_error=NVMLError("driver not loaded"))
    source = NvmlSource(nvml=nvml)
    for _ in range(RETRY_INIT_EVERY):
        assert source.read() == []
    assert nvml.inits == 1 and "driver not loaded" in (source.reason or "")
    nvml.init_error = None
    gpus = source.read()  # the next retry finds the driver
    assert nvml.inits == 2 and len(gpus) == 1 and source.reason is None


def test_no_gpu_visible() -> None:
    source = NvmlSource(nvml=FakePynvml([]))
    assert source.read() == [] and source.reason == "no GPU visible to NVML"


def test_the_fake_source_stands_behind_the_same_interface() -> None:
    source: GpuSource = FakeGpuSource([GpuHeadroom(0, 100, 3, 0.99, "sim")])
    assert source.read()[0].memory_free_ratio == 0.03
    empty = FakeGpuSource()
    assert empty.read() == [] and empty.reason
