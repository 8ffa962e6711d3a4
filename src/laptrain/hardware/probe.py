"""The one interface behind which laptrain reads the device: a ``DeviceProbe`` answers memory,
cache release, synchronisation and precision support, and what acts on it takes it as an
argument, so MPS and CUDA branches run on CPU with a ``FakeProbe`` (tests/fakes.py). torch is
imported inside the methods: the launcher imports this before the profile's environment is
applied (docs/hardware.md §1, §2, §6)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

DEVICE_KINDS = ("cpu", "cuda", "mps")


@dataclass(frozen=True)
class MemoryReading:
    """One snapshot of host and device memory, in bytes (``None`` where the device has no such figure)."""

    rss: int
    system_total: int
    system_available: int
    system_percent: float
    swap_used: int
    # MPS: torch.mps.current_allocated_memory; CUDA: torch.cuda.memory_allocated.
    device_allocated: int | None = None
    # MPS: torch.mps.driver_allocated_memory (includes the allocator cache); CUDA: memory_reserved.
    device_reserved: int | None = None
    # CUDA: max_memory_allocated. MPS has no peak API (docs/hardware.md §7).
    device_peak: int | None = None
    # MPS: torch.mps.recommended_max_memory; CUDA: total memory of the device.
    device_limit: int | None = None
    # CUDA: free memory on the device for all processes (torch.cuda.mem_get_info); the preflight's budget.
    device_free: int | None = None


@runtime_checkable
class DeviceProbe(Protocol):
    """What device-specific code may ask. ``kind`` is one of ``cpu``, ``cuda``, ``mps``; ``index``
    is which CUDA GPU it reads (None: the current CUDA device; unused off CUDA)."""

    kind: str
    index: int | None

    def available(self) -> bool:
        """Whether this kind of device can be used in this process."""

    def bf16_supported(self) -> bool:
        """Whether bfloat16 compute works on this device."""

    def memory(self) -> MemoryReading:
        """Current host and device memory."""

    def empty_cache(self) -> None:
        """Give the device allocator's cached blocks back (no-op on CPU)."""

    def synchronize(self) -> None:
        """Wait for queued device work, so that a clock read measures compute (no-op on CPU)."""

    def reset_peak(self) -> None:
        """Start a new peak-memory window where the device keeps one (CUDA)."""


def _host_memory() -> dict[str, float]:
    import psutil

    vm = psutil.virtual_memory()
    return {
        "rss": psutil.Process(os.getpid()).memory_info().rss,
        "system_total": vm.total,
        "system_available": vm.available,
        "system_percent": vm.percent,
        "swap_used": psutil.swap_memory().used,
    }


class TorchProbe:
    """The real probe: psutil for the host, ``torch.cuda`` / ``torch.mps`` for the device.

    On CUDA every figure is read from GPU ``index`` (None: the current device): with
    ``trainer.devices=[2,3]`` rank 0 reads GPU 2, not GPU 0."""

    def __init__(self, kind: str = "cpu", index: int | None = None) -> None:
        if kind not in DEVICE_KINDS:
            raise ValueError(f"unknown device kind {kind!r}: use one of {', '.join(DEVICE_KINDS)}")
        self.kind = kind
        self.index = index

    def available(self) -> bool:
        import torch

        if self.kind == "cuda":
            return torch.cuda.is_available()
        if self.kind == "mps":
            return torch.backends.mps.is_available()
        return True

    def bf16_supported(self) -> bool:
        import torch

        if self.kind == "cuda":
            # torch's default counts bf16 *emulated* on pre-Ampere GPUs (T4, V100, RTX 20xx) as
            # supported (torch/cuda/__init__.py ``is_bf16_supported(including_emulation=True)``);
            # emulation is slow, so only native bf16 counts (docs/hardware.md §4). torch asks the
            # current device (torch/cuda/__init__.py:191-205: ROCm always, else compute
            # capability >= 8); the same rule is applied to this probe's GPU.
            if not torch.cuda.is_available():
                return False
            if torch.version.hip:
                return True
            return torch.cuda.get_device_properties(self._cuda_index()).major >= 8
        if self.kind == "mps":
            # bf16 on MPS needs macOS >= 14, which current torch's MPS requires anyway
            # (docs/hardware.md §13).
            return torch.backends.mps.is_available() and torch.backends.mps.is_macos_or_newer(14, 0)
        return True

    def _cuda_index(self) -> int:
        import torch

        return torch.cuda.current_device() if self.index is None else self.index

    def memory(self) -> MemoryReading:
        import torch

        host = _host_memory()
        if self.kind == "cuda" and torch.cuda.is_available():
            index = self._cuda_index()
            return MemoryReading(
                **host,
                device_allocated=torch.cuda.memory_allocated(index),
                device_reserved=torch.cuda.memory_reserved(index),
                device_peak=torch.cuda.max_memory_allocated(index),
                device_limit=torch.cuda.get_device_properties(index).total_memory,
                device_free=torch.cuda.mem_get_info(index)[0],
            )
        if self.kind == "mps" and torch.backends.mps.is_available():
            return MemoryReading(
                **host,
                device_allocated=torch.mps.current_allocated_memory(),
                device_reserved=torch.mps.driver_allocated_memory(),
                device_limit=torch.mps.recommended_max_memory(),
            )
        return MemoryReading(**host)

    def empty_cache(self) -> None:
        import torch

        if self.kind == "cuda" and torch.cuda.is_available():
            torch.cuda.empty_cache()
        elif self.kind == "mps" and torch.backends.mps.is_available():
            torch.mps.empty_cache()

    def synchronize(self) -> None:
        import torch

        if self.kind == "cuda" and torch.cuda.is_available():
            torch.cuda.synchronize(self._cuda_index())
        elif self.kind == "mps" and torch.backends.mps.is_available():
            torch.mps.synchronize()

    def reset_peak(self) -> None:
        import torch

        if self.kind == "cuda" and torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats(self._cuda_index())


def probe_for(device: object) -> DeviceProbe:
    """The real probe for a ``torch.device`` or a string such as ``"cuda:0"``."""
    text = str(device)
    kind, _, index = text.partition(":")
    if kind not in DEVICE_KINDS:
        kind = "cpu"
    return TorchProbe(kind, int(index) if index else None)
