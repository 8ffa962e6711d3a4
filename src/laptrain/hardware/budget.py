"""The memory budget of a hardware profile, applied to what the device probe reads now."""

from __future__ import annotations

from dataclasses import dataclass

from laptrain.hardware.probe import DeviceProbe

GB = 1024**3


@dataclass(frozen=True)
class Budget:
    bytes: float
    source: str  # e.g. "0.8 x MPS recommended max 12.0 GB"


def device_budget(
    probe: DeviceProbe, memory_fraction: float, memory_budget_gb: float | None = None
) -> Budget:
    """The profile's budget rule applied to what the probe reads now."""
    if memory_budget_gb:
        return Budget(float(memory_budget_gb) * GB, f"hardware.memory_budget_gb={memory_budget_gb}")
    reading = probe.memory()
    if probe.kind == "mps" and reading.device_limit:
        limit = memory_fraction * reading.device_limit
        if reading.system_available and reading.system_available < limit:
            return Budget(
                float(reading.system_available),
                f"available RAM {reading.system_available / GB:.1f} GB (below "
                f"{memory_fraction} x MPS recommended max {reading.device_limit / GB:.1f} GB)",
            )
        return Budget(
            limit, f"{memory_fraction} x MPS recommended max {reading.device_limit / GB:.1f} GB"
        )
    if probe.kind == "cuda":
        free = reading.device_free
        if free is None and reading.device_limit:
            free = reading.device_limit - (reading.device_reserved or 0)
        if free:
            return Budget(
                memory_fraction * free, f"{memory_fraction} x free GPU memory {free / GB:.1f} GB"
            )
    available = reading.system_available
    return Budget(
        memory_fraction * available + reading.rss,
        f"{memory_fraction} x available RAM {available / GB:.1f} GB + this process {reading.rss / GB:.1f} GB",
    )
