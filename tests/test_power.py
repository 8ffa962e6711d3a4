"""laptrain.hardware.power: battery and pressure readers, top processes, the keep-awake holder."""

from __future__ import annotations

import io
import os
from collections import namedtuple

import psutil
import pytest

from laptrain.hardware.power import (
    BatteryReading,
    KeepAwake,
    ProcessMemory,
    PsutilBattery,
    SysctlPressure,
    inhibit_command,
    pressure_name,
    pressure_source,
    top_processes,
)
from tests.fakes import FakePressure

# psutil's own tuple (psutil/_ntuples.py): percent, secsleft, power_plugged
SBattery = namedtuple("SBattery", "percent secsleft power_plugged")


class FakeProcess:
    """A ``subprocess.Popen`` stand-in: running until terminated, or exited at once with ``code``."""

    def __init__(self, code: int | None = None, stderr: str = "") -> None:
        self.code, self.stderr, self.terminated = code, io.StringIO(stderr), 0

    def poll(self) -> int | None:
        return self.code

    def terminate(self) -> None:
        self.terminated += 1
        self.code = -15

    def wait(self, timeout: float | None = None) -> int | None:
        return self.code

    def kill(self) -> None:
        self.code = -9


class FakeSpawn:
    """Records every command started; each gets a new ``FakeProcess(**kwargs)``."""

    def __init__(self, **kwargs) -> None:
        self.kwargs, self.commands, self.processes = kwargs, [], []

    def __call__(self, command: list[str]) -> FakeProcess:
        self.commands.append(command)
        self.processes.append(FakeProcess(**self.kwargs))
        return self.processes[-1]


def awake(platform: str = "darwin", which=lambda name: f"/usr/bin/{name}", **kwargs) -> KeepAwake:
    return KeepAwake(
        platform=platform, which=which, spawn=FakeSpawn(**kwargs), settle_s=0, sleep=lambda s: None
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (SBattery(80, psutil.POWER_TIME_UNLIMITED, True), BatteryReading(80.0, True, None)),
        (SBattery(35.5, 5400, False), BatteryReading(35.5, False, 5400)),
        (SBattery(12, psutil.POWER_TIME_UNKNOWN, False), BatteryReading(12.0, False, None)),
        (SBattery(50, psutil.POWER_TIME_UNKNOWN, None), BatteryReading(50.0, None, None)),
        (None, None),  # psutil's answer on a machine without a battery
    ],
)
def test_psutil_battery_maps_psutils_fields(monkeypatch, raw, expected):
    monkeypatch.setattr(psutil, "sensors_battery", lambda: raw)
    assert PsutilBattery().read() == expected


def test_only_an_explicit_false_counts_as_on_battery():
    assert BatteryReading(50, False).on_battery
    assert not BatteryReading(50, True).on_battery and not BatteryReading(50, None).on_battery


def test_sysctl_pressure_reads_the_kernel_level_and_tolerates_failures():
    asked = []

    def run(command):
        asked.append(command)
        return answers.pop(0)

    answers = ["2\n", None, "garbage\n", "4\n"]
    source = SysctlPressure(run=run)
    assert [source.read() for _ in range(4)] == [2, None, None, 4]
    assert asked[0][1:] == ["-n", "kern.memorystatus_vm_pressure_level"]


def test_sysctl_pressure_reads_with_a_path_without_usr_sbin(monkeypatch, tmp_path):
    """A Python started by launchd, cron or an IDE may lack /usr/sbin on PATH."""
    monkeypatch.setenv("PATH", str(tmp_path))
    asked = []
    source = SysctlPressure(run=lambda command: asked.append(command) or "4\n")
    assert source.read() == 4
    assert asked == [["/usr/sbin/sysctl", "-n", "kern.memorystatus_vm_pressure_level"]]


def test_pressure_names_and_where_a_source_exists():
    assert [pressure_name(x) for x in (1, 2, 4, 3, None)] == [
        "normal",
        "warning",
        "critical",
        "unknown (3)",
        "unread",
    ]
    assert isinstance(pressure_source("darwin"), SysctlPressure)
    assert pressure_source("linux") is None
    scripted = FakePressure([1, 4])
    assert [scripted.read() for _ in range(3)] == [1, 4, 4]  # the last level repeats


def test_top_processes_are_the_largest_others_by_rss():
    top = top_processes(3)
    assert len(top) <= 3 and os.getpid() not in [p.pid for p in top]
    assert [p.rss for p in top] == sorted((p.rss for p in top), reverse=True)
    everyone = top_processes(10_000, exclude_pid=-1)
    assert os.getpid() in [p.pid for p in everyone]  # only the excluded pid is left out
    assert ProcessMemory("Safari", 501, 3 * 1024**3).text() == "Safari (pid 501) 3.0 GiB"


def test_inhibit_commands_per_platform():
    which = {"systemd-inhibit": "/usr/bin/systemd-inhibit", "tail": "/usr/bin/tail"}.get
    assert inhibit_command(42, "darwin", lambda n: None) == [
        "/usr/bin/caffeinate",
        "-i",
        "-w",
        "42",
    ]
    linux = inhibit_command(42, "linux", which)
    assert linux[0] == "systemd-inhibit" and "--what=idle:sleep" in linux
    assert linux[-4:] == ["tail", "--pid=42", "-f", "/dev/null"]  # ends when pid 42 does
    assert inhibit_command(42, "linux", lambda n: None) is None
    assert inhibit_command(42, "win32", which) is None


def test_keep_awake_starts_caffeinate_for_this_process_and_stops_it_once():
    holder = awake()
    line = holder.start()
    assert holder.spawn.commands == [["/usr/bin/caffeinate", "-i", "-w", str(os.getpid())]]
    assert line == f"`/usr/bin/caffeinate -i -w {os.getpid()}` holds off idle sleep while training"
    assert holder.held
    holder.stop()
    holder.stop()
    assert holder.spawn.processes[0].terminated == 1 and not holder.held


def test_keep_awake_reports_a_holder_that_fails_at_once():
    holder = awake("linux", code=1, stderr="Failed to connect to bus: No such file or directory\n")
    line = holder.start(pid=7)
    assert "exited at once (code 1: Failed to connect to bus" in line and "sleep not held" in line
    assert not holder.held
    holder.stop()
    assert holder.spawn.processes[0].terminated == 0


def test_keep_awake_without_an_inhibitor_or_when_spawning_fails():
    holder = awake("linux", which=lambda name: None)
    assert holder.start(pid=7).startswith("no sleep inhibitor on linux")
    assert holder.spawn.commands == []

    def refuse(command):
        raise FileNotFoundError(2, "No such file or directory")

    broken = KeepAwake(platform="darwin", spawn=refuse, settle_s=0, sleep=lambda s: None)
    assert broken.start(pid=7).startswith("could not start `")
    broken.stop()  # nothing to stop: no error
