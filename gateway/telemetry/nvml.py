"""GPU headroom from NVML (``pynvml``, shipped as ``nvidia-ml-py``): free memory and utilisation per GPU.

The gateway polls :meth:`NvmlSource.read` in a worker thread every few seconds, never on the request
path (an NVML call can block for milliseconds, and a wedged driver for much longer). A machine without
the NVML library, without a driver or without a GPU is normal (a CPU llama-server, a laptop, CI), so
every such case reads as "unknown": an empty list and a ``reason``, never an exception. The controller
then runs on its other signals. :class:`FakeGpuSource` stands behind the same interface for tests and
the demo.

Indices are NVML's (PCI bus order), which is not necessarily CUDA's order under ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any, Protocol, cast

from gateway.control.observation import GpuHeadroom

log = logging.getLogger("sweetspot.nvml")

# After a failed initialisation, try again only every this many reads: a driver rarely appears at
# runtime, and a failing dlopen on every poll would only add noise.
RETRY_INIT_EVERY = 10


class GpuSource(Protocol):
    """Anything that reads GPU headroom. ``reason`` says why the last read returned nothing."""

    reason: str | None

    def read(self) -> list[GpuHeadroom]: ...

    def close(self) -> None: ...


class NvmlLibrary(Protocol):
    """The part of the ``pynvml`` module this source calls (tests without a GPU pass a fake of it)."""

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int: ...

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...


class NvmlSource:
    """All visible GPUs, or the NVML ``indices`` given (an unknown index is skipped and reported)."""

    def __init__(self, indices: Sequence[int] = (), *, nvml: NvmlLibrary | None = None) -> None:
        self.indices = tuple(indices)
        self.reason: str | None = None
        self._nvml: NvmlLibrary | None = nvml  # the pynvml module unless given
        self._ready = False
        self._failed_reads = 0

    def _init(self) -> bool:
        if self._ready:
            return True
        if self._failed_reads % RETRY_INIT_EVERY:
            self._failed_reads += 1
            return False
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = cast(NvmlLibrary, pynvml)
            self._nvml.nvmlInit()
        except ImportError as exc:
            return self._fail(f"pynvml is not installed ({exc})")
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded...: all mean "unknown"
            return self._fail(f"NVML unavailable: {_describe(exc)}")
        self._ready = True
        self._failed_reads = 0
        return True

    def _fail(self, reason: str) -> bool:
        if self.reason != reason:
            log.info("GPU headroom unknown: %s", reason)
        self.reason = reason
        self._failed_reads += 1
        return False

    def read(self) -> list[GpuHeadroom]:
        """One reading of every selected GPU; ``[]`` (with ``reason`` set) when NVML cannot tell."""
        if not self._init():
            return []
        nvml = self._nvml
        assert nvml is not None  # set by _init
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:  # noqa: BLE001 - NVML's errors (or a broken binding's) read as "unknown"
            self.reason = f"cannot count GPUs: {_describe(exc)}"
            return []
        wanted = self.indices or tuple(range(count))
        missing = [i for i in wanted if not 0 <= i < count]
        gpus = [gpu for gpu in (self._read_one(i) for i in wanted if 0 <= i < count) if gpu is not None]
        if not gpus:
            self.reason = "no GPU visible to NVML" if count == 0 else f"no readable GPU among {list(wanted)}"
        elif missing:
            self.reason = f"GPU indices {missing} not present ({count} visible)"
        else:
            self.reason = None
        return gpus

    def _read_one(self, index: int) -> GpuHeadroom | None:
        nvml = self._nvml
        assert nvml is not None  # only called from read(), after _init
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        except Exception as exc:  # noqa: BLE001 - one unreadable GPU is skipped, never an error
            log.debug("GPU %d unreadable: %s", index, _describe(exc))
            return None
        utilization: float | None
        try:
            utilization = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0
        except Exception:  # noqa: BLE001 - NotSupported on some boards and in MIG mode: unknown
            utilization = None
        try:
            name = nvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # noqa: BLE001 - a name is cosmetic: unknown is ""
            name = ""
        return GpuHeadroom(
            index=index,
            memory_total_bytes=int(memory.total),
            memory_free_bytes=int(memory.free),
            utilization=utilization,
            name=name,
        )

    def close(self) -> None:
        if self._ready and self._nvml is not None:
            with contextlib.suppress(Exception):  # shutting down: an NVML error changes nothing
                self._nvml.nvmlShutdown()
        self._ready = False


class FakeGpuSource:
    """A GPU source that reports what it is told: for tests, the scenario harness and the demo."""

    def __init__(self, gpus: Sequence[GpuHeadroom] = (), *, reason: str | None = None) -> None:
        self.gpus = list(gpus)
        self.reason = reason if gpus or reason else "fake source with no GPUs"
        self.reads = 0
        self.closed = False

    def set(self, gpus: Sequence[GpuHeadroom], reason: str | None = None) -> None:
        self.gpus = list(gpus)
        self.reason = reason if gpus or reason else "fake source with no GPUs"

    def read(self) -> list[GpuHeadroom]:
        self.reads += 1
        return list(self.gpus)

    def close(self) -> None:
        self.closed = True


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
