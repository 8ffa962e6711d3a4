"""Scripted stand-ins for the device probe and the laptop guards' sources, for tests and for the
``callbacks=fake_mps`` dry run of an Apple profile on CPU (tests/conf/callbacks/)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TypeVar

from laptrain.hardware.power import BatteryReading
from laptrain.hardware.probe import MemoryReading
from laptrain.hardware.thermal import ThermalReading

T = TypeVar("T")


def next_scripted(script: list[T]) -> T | None:
    """The next of a test fake's scripted answers: in order, the last one repeats; None when empty."""
    if not script:
        return None
    answer = script[0]
    if len(script) > 1:
        script.pop(0)
    return answer


@dataclass
class FakeProbe:
    """A scripted probe for tests and for ``hardware.probe=fake_<kind>`` dry runs on CPU.

    ``readings`` are returned in order by ``memory()`` (the last one repeats); ``calls`` records
    what was asked, so tests can assert that a cache was emptied.
    """

    kind: str = "cpu"
    index: int | None = None
    is_available: bool = True
    has_bf16: bool = True
    readings: list[MemoryReading] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)

    def available(self) -> bool:
        return self.is_available

    def bf16_supported(self) -> bool:
        return self.has_bf16

    def memory(self) -> MemoryReading:
        self.calls.append("memory")
        reading = next_scripted(self.readings)
        if reading is None:
            return MemoryReading(
                rss=0, system_total=0, system_available=0, system_percent=0.0, swap_used=0
            )
        return replace(reading)

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")

    def synchronize(self) -> None:
        self.calls.append("synchronize")

    def reset_peak(self) -> None:
        self.calls.append("reset_peak")


@dataclass
class FakeBattery:
    """Scripted readings for tests: returned in order, the last one repeats; empty = no battery."""

    readings: list[BatteryReading] = field(default_factory=list)
    name: str = "fake"
    calls: int = 0

    def read(self) -> BatteryReading | None:
        self.calls += 1
        return next_scripted(self.readings)


@dataclass
class FakePressure:
    """Scripted pressure levels for tests: in order, the last one repeats; empty = no answer."""

    levels: list[int | None] = field(default_factory=list)
    name: str = "fake"

    def read(self) -> int | None:
        return next_scripted(self.levels)


@dataclass
class FakeThermal:
    """Scripted readings for tests: returned in order, the last one repeats; None = no answer."""

    readings: list[ThermalReading | None] = field(default_factory=list)
    name: str = "fake"
    calls: int = 0

    def read(self) -> ThermalReading | None:
        self.calls += 1
        return next_scripted(self.readings)
