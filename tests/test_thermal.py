"""Thermal sources: macOS thermalState through PyObjC, Linux sensors, the fallback to none."""

from __future__ import annotations

import sys
import types
from collections import namedtuple

import pytest

from laptrain.hardware import thermal
from laptrain.hardware.thermal import (
    MacThermalState,
    SensorTemperature,
    ThermalReading,
    ThermalSource,
    thermal_source,
)
from tests.fakes import FakeThermal

Shwtemp = namedtuple("Shwtemp", "label current high critical")  # psutil's record


def fake_foundation(monkeypatch, state: int) -> None:
    info = types.SimpleNamespace(thermalState=lambda: state)
    module = types.ModuleType("Foundation")
    module.NSProcessInfo = types.SimpleNamespace(processInfo=lambda: info)
    monkeypatch.setitem(sys.modules, "Foundation", module)


def fake_sensors(monkeypatch, groups: dict) -> None:
    import psutil

    monkeypatch.setattr(psutil, "sensors_temperatures", lambda: groups, raising=False)


def test_mac_thermal_state_maps_apple_levels(monkeypatch):
    fake_foundation(monkeypatch, 2)
    reading = MacThermalState().read()
    assert reading == ThermalReading(level=2) and reading.name == "serious"


def test_mac_without_pyobjc_falls_back_to_drift_only(monkeypatch):
    monkeypatch.setattr(thermal.sys, "platform", "darwin")
    monkeypatch.setitem(sys.modules, "Foundation", None)  # import raises ImportError
    assert thermal_source() is None


def test_mac_with_pyobjc_is_chosen_first(monkeypatch):
    monkeypatch.setattr(thermal.sys, "platform", "darwin")
    fake_foundation(monkeypatch, 0)
    source = thermal_source()
    assert isinstance(source, MacThermalState) and source.name == "macos_thermal_state"


def test_linux_uses_the_hottest_sensor_and_its_own_marks(monkeypatch):
    monkeypatch.setattr(thermal.sys, "platform", "linux")
    fake_sensors(
        monkeypatch,
        {
            "coretemp": [
                Shwtemp("Core 0", 71.0, 90.0, 100.0),
                Shwtemp("Core 1", 84.0, 90.0, 100.0),
            ],
            "acpitz": [Shwtemp("", 40.0, None, None)],
        },
    )
    source = thermal_source()
    assert isinstance(source, SensorTemperature)
    assert source.read() == ThermalReading(level=1, celsius=84.0)  # within 10 °C of `high`


@pytest.mark.parametrize(
    ("entry", "level"),
    [
        (Shwtemp("", 60.0, None, None), 0),
        (Shwtemp("", 80.0, None, None), 1),
        (Shwtemp("", 86.0, None, None), 2),  # no marks: hot_celsius (85, field note 002)
        (Shwtemp("", 95.0, 95.0, 105.0), 2),
        (Shwtemp("", 105.0, 95.0, 105.0), 3),
    ],
)
def test_sensor_levels(monkeypatch, entry, level):
    fake_sensors(monkeypatch, {"cpu": [entry]})
    assert SensorTemperature().read().level == level


def test_linux_without_sensors_has_no_source(monkeypatch):
    monkeypatch.setattr(thermal.sys, "platform", "linux")
    fake_sensors(monkeypatch, {})
    assert thermal_source() is None


def test_fake_replays_and_counts():
    fake = FakeThermal([ThermalReading(0), None, ThermalReading(3)])
    assert isinstance(fake, ThermalSource)
    assert [fake.read(), fake.read(), fake.read(), fake.read()] == [
        ThermalReading(0),
        None,
        ThermalReading(3),
        ThermalReading(3),
    ]
    assert fake.calls == 4
