"""The peak memory of a stretch of work, read from the device's own counters, in the units of the
device's budget (budget.py), for the measured preflight (measured.py):

Linux CPU: ``VmHWM``, reset through ``/proc/self/clear_refs`` (proc(5); ``ru_maxrss`` cannot be);
other CPUs: a sampling thread; CUDA: ``max_memory_reserved``; MPS (no peak API, docs/hardware.md
§7): ``driver_allocated_memory`` at every :meth:`PeakCounter.note`.
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
from pathlib import Path
from typing import Protocol

from laptrain.hardware.malloc import glibc_version
from laptrain.hardware.peak_rss import STATUS, status_kib

CLEAR_REFS = Path("/proc/self/clear_refs")
SAMPLE_SECONDS = 0.001


class PeakCounter(Protocol):
    """The highest memory (bytes) between :meth:`reset` and :meth:`peak`, read at each
    :meth:`note`."""

    kind: str

    def level(self) -> float:
        """Bytes the process (CPU) or the device (CUDA, MPS) holds now."""

    def reset(self) -> None:
        """Start a new window at the current level."""

    def note(self) -> None:
        """A moment the peak may be at (MPS reads here; the other counters need no reading)."""

    def peak(self) -> float:
        """The highest level since :meth:`reset`."""


class KernelPeakRss:
    """Linux: the resident-set high-water mark the kernel keeps, reset through ``clear_refs``."""

    kind = "cpu"

    def __init__(self, status: Path = STATUS, clear_refs: Path = CLEAR_REFS) -> None:
        self.status, self.clear_refs = status, clear_refs

    def level(self) -> float:
        return float(status_kib("VmRSS", self.status) * 1024)

    def reset(self) -> None:
        self.clear_refs.write_text("5")

    def note(self) -> None:
        pass

    def peak(self) -> float:
        return float(status_kib("VmHWM", self.status) * 1024)


class SampledRss:
    """Where the kernel keeps no resettable peak (macOS): the resident set sampled by a thread
    every millisecond between :meth:`reset` and :meth:`peak` (torch's kernels release the GIL,
    so the thread runs while they do)."""

    kind = "cpu"

    def __init__(self) -> None:
        import psutil

        self.process = psutil.Process(os.getpid())
        self.highest = 0.0
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def level(self) -> float:
        return float(self.process.memory_info().rss)

    def _sample(self) -> None:
        while not self.stop.wait(SAMPLE_SECONDS):
            self.note()

    def reset(self) -> None:
        self._join()
        self.highest = self.level()
        self.stop.clear()
        self.thread = threading.Thread(target=self._sample, name="laptrain-rss", daemon=True)
        self.thread.start()

    def note(self) -> None:
        self.highest = max(self.highest, self.level())

    def _join(self) -> None:
        if self.thread is not None:
            self.stop.set()
            self.thread.join()
            self.thread = None

    def peak(self) -> float:
        self._join()
        self.note()
        return self.highest


class CudaPeak:
    """CUDA: the caching allocator's own peak of reserved bytes on GPU ``index``."""

    kind = "cuda"

    def __init__(self, index: int | None = None) -> None:
        import torch

        self.index = torch.cuda.current_device() if index is None else index

    def level(self) -> float:
        import torch

        return float(torch.cuda.memory_reserved(self.index))

    def reset(self) -> None:
        import torch

        torch.cuda.synchronize(self.index)
        torch.cuda.reset_peak_memory_stats(self.index)

    def note(self) -> None:
        pass

    def peak(self) -> float:
        import torch

        torch.cuda.synchronize(self.index)
        return float(torch.cuda.max_memory_reserved(self.index))


class MpsPeak:
    """MPS: the Metal memory of the process (allocator cache included) read at each note."""

    kind = "mps"

    def __init__(self) -> None:
        self.highest = 0.0

    def level(self) -> float:
        import torch

        torch.mps.synchronize()
        return float(torch.mps.driver_allocated_memory())

    def reset(self) -> None:
        self.highest = self.level()

    def note(self) -> None:
        self.highest = max(self.highest, self.level())

    def peak(self) -> float:
        self.note()
        return self.highest


def counter_for(kind: str, index: int | None = None) -> PeakCounter:
    """The counter of a device kind (cpu, cuda, mps); on CPU the kernel's when it can be reset."""
    if kind == "cuda":
        return CudaPeak(index)
    if kind == "mps":
        return MpsPeak()
    try:
        counter = KernelPeakRss()
        counter.reset()
        counter.peak()
    except OSError:
        return SampledRss()
    return counter


def release_freed(kind: str) -> None:
    """Give freed memory back before a new window: Python's cycles, glibc's free heap pages
    (``malloc_trim(0)``, glibc only: otherwise a smaller batch measured after a larger one reads
    the pages the larger one left in the heap), the device allocator's cache."""
    import torch

    gc.collect()
    if glibc_version():
        ctypes.CDLL(None).malloc_trim(0)
    if kind == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()
    elif kind == "mps" and torch.backends.mps.is_available():
        torch.mps.empty_cache()
