"""Where the thermal guard learns that the machine is hot (docs/hardware.md §11), first that works:
``MacThermalState`` (macOS ``ProcessInfo.thermalState`` through PyObjC, ``laptrain[mac]``: Apple's
only public thermal API) and ``SensorTemperature`` (Linux ``psutil.sensors_temperatures()``, the
hottest sensor against its own ``high``/``critical`` marks). Without one the guard judges by
throughput drift alone (``laptrain.callbacks.throughput_drift``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

LEVEL_NAMES = ("nominal", "fair", "serious", "critical")


@dataclass(frozen=True)
class ThermalReading:
    """One reading: ``level`` on Apple's 0-3 scale, and ``celsius`` where a sensor gives it."""

    level: int
    celsius: float | None = None

    @property
    def name(self) -> str:
        return LEVEL_NAMES[max(0, min(self.level, 3))]


@runtime_checkable
class ThermalSource(Protocol):
    """Anything that can say how hot the machine is; ``read`` returns None when it cannot tell."""

    name: str

    def read(self) -> ThermalReading | None: ...


class MacThermalState:
    """``NSProcessInfo.processInfo.thermalState`` via PyObjC (macOS 10.10.3+)."""

    name = "macos_thermal_state"

    def __init__(self) -> None:
        from Foundation import NSProcessInfo  # PyObjC; ImportError when the [mac] extra is absent

        self._info = NSProcessInfo.processInfo()

    def read(self) -> ThermalReading | None:
        return ThermalReading(level=int(self._info.thermalState()))


class SensorTemperature:
    """The hottest ``psutil.sensors_temperatures()`` entry, mapped to a 0-3 level."""

    name = "psutil_sensors"

    def __init__(self, hot_celsius: float = 85.0) -> None:
        import psutil

        if not hasattr(psutil, "sensors_temperatures"):
            raise OSError("psutil has no temperature sensors on this platform")
        self._psutil = psutil
        self.hot_celsius = hot_celsius
        if self.read() is None:
            raise OSError("psutil found no temperature sensors")

    def read(self) -> ThermalReading | None:
        entries = [e for group in self._psutil.sensors_temperatures().values() for e in group]
        if not entries:
            return None
        hottest = max(entries, key=lambda e: e.current)
        return ThermalReading(level=self.level(hottest), celsius=float(hottest.current))

    def level(self, entry: object) -> int:
        current = entry.current
        critical = getattr(entry, "critical", None)
        high = getattr(entry, "high", None) or self.hot_celsius
        if critical and current >= critical:
            return 3
        if current >= high:
            return 2
        if current >= high - 10:
            return 1
        return 0


def thermal_source(hot_celsius: float = 85.0) -> ThermalSource | None:
    """The first source that works on this machine, or None (the guard then uses drift only)."""
    if sys.platform == "darwin":
        try:
            return MacThermalState()
        except ImportError:
            return None
    try:
        return SensorTemperature(hot_celsius=hot_celsius)
    except OSError:
        return None
