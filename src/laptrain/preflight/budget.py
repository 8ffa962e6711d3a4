"""The memory budget of a hardware profile, applied to what the device probe reads now
(docs/hardware.md §1b): on MPS under the allocator's LOW watermark (above it the allocator frees
its cache and commits more often on every allocation, aten/src/ATen/mps/MPSAllocator.mm), and
less the loader workers' host memory wherever the model trains in host memory (CPU, MPS)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from laptrain.hardware.probe import DeviceProbe
from laptrain.preflight.worker_memory import WorkerCost

GiB = 1024**3
# MPSAllocator.mm's default LOW watermark on unified memory (Apple Silicon) when the variable is unset.
MPS_DEFAULT_LOW_WATERMARK = 1.4


@dataclass(frozen=True)
class Budget:
    bytes: float
    source: str  # e.g. "0.65 x MPS recommended max 12.0 GiB"


def mps_low_watermark(environ: Mapping[str, str] | None = None) -> float:
    """The LOW watermark ratio the MPS allocator will use in this process (0.0 = no LOW limit)."""
    value = (os.environ if environ is None else environ).get("PYTORCH_MPS_LOW_WATERMARK_RATIO")
    try:
        return float(value) if value is not None else MPS_DEFAULT_LOW_WATERMARK
    except ValueError:
        return MPS_DEFAULT_LOW_WATERMARK


def _device_budget(
    probe: DeviceProbe,
    memory_fraction: float,
    memory_budget_gb: float | None,
    environ: Mapping[str, str] | None,
) -> Budget:
    # hardware.memory_budget_gb is in GiB (2^30 bytes); the key keeps its name for users' configs.
    if memory_budget_gb:
        return Budget(
            float(memory_budget_gb) * GiB, f"hardware.memory_budget_gb={memory_budget_gb}"
        )
    reading = probe.memory()
    if probe.kind == "mps" and reading.device_limit:
        low = mps_low_watermark(environ)
        fraction = min(memory_fraction, low) if low > 0 else memory_fraction
        capped = f" (capped at the LOW watermark {low})" if fraction < memory_fraction else ""
        limit = fraction * reading.device_limit
        if reading.system_available and reading.system_available < limit:
            return Budget(
                float(reading.system_available),
                f"available RAM {reading.system_available / GiB:.1f} GiB (below "
                f"{fraction} x MPS recommended max {reading.device_limit / GiB:.1f} GiB)",
            )
        return Budget(
            limit, f"{fraction} x MPS recommended max {reading.device_limit / GiB:.1f} GiB{capped}"
        )
    if probe.kind == "cuda":
        free = reading.device_free
        if free is None and reading.device_limit:
            free = reading.device_limit - (reading.device_reserved or 0)
        if free:
            return Budget(
                memory_fraction * free, f"{memory_fraction} x free GPU memory {free / GiB:.1f} GiB"
            )
    available = reading.system_available
    return Budget(
        memory_fraction * available + reading.rss,
        f"{memory_fraction} x available RAM {available / GiB:.1f} GiB + this process {reading.rss / GiB:.1f} GiB",
    )


def device_budget(
    probe: DeviceProbe,
    memory_fraction: float,
    memory_budget_gb: float | None = None,
    workers: WorkerCost | None = None,
    environ: Mapping[str, str] | None = None,
) -> Budget:
    """The profile's budget on what the probe reads now, less loader workers' memory on CPU and
    MPS."""
    budget = _device_budget(probe, memory_fraction, memory_budget_gb, environ)
    if workers is None or probe.kind == "cuda":
        return budget
    return Budget(budget.bytes - workers.total, f"{budget.source} - {workers.text()}")


def capacity_budget(
    probe: DeviceProbe, memory_fraction: float, memory_budget_gb: float | None = None
) -> float:
    """The budget rule applied to the device's total memory rather than what is free now: the same
    number on every rank of identical devices, whatever else runs on them (torchrun and srun ranks
    decide ``base_dtype: auto`` from it, laptrain.families.lora.base_dtype)."""
    if memory_budget_gb:
        return float(memory_budget_gb) * GiB
    reading = probe.memory()
    if probe.kind in ("cuda", "mps") and reading.device_limit:
        return memory_fraction * reading.device_limit
    return memory_fraction * float(reading.system_total or reading.system_available)
