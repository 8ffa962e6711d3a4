"""Where the laptop guards learn about power and memory pressure, and how the machine is kept awake
(docs/hardware.md §16); each is injectable, so the guards run on a CPU-only machine with fakes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from laptrain.hardware.detect import run_probe, sysctl_path

# kern.memorystatus_vm_pressure_level answers with XNU's dispatch levels (bsd/sys/event.h)
PRESSURE_NORMAL, PRESSURE_WARNING, PRESSURE_CRITICAL = 1, 2, 4
PRESSURE_NAMES = {
    PRESSURE_NORMAL: "normal",
    PRESSURE_WARNING: "warning",
    PRESSURE_CRITICAL: "critical",
}
# Activity Monitor's memory-pressure graph colours for the same levels (unverified mapping)
PRESSURE_COLOURS = {PRESSURE_NORMAL: "green", PRESSURE_WARNING: "yellow", PRESSURE_CRITICAL: "red"}


def pressure_name(level: int | None) -> str:
    """``normal`` / ``warning`` / ``critical``, ``unknown (N)`` for another value, ``unread`` for None."""
    if level is None:
        return "unread"
    return PRESSURE_NAMES.get(level, f"unknown ({level})")


@dataclass(frozen=True)
class BatteryReading:
    """One battery reading. ``plugged`` None: the OS did not say; ``seconds_left`` None: unknown or
    on the charger (psutil's negative POWER_TIME_* constants are turned into None)."""

    percent: float
    plugged: bool | None
    seconds_left: int | None = None

    @property
    def on_battery(self) -> bool:
        return self.plugged is False


@runtime_checkable
class BatterySource(Protocol):
    """Anything that reads the battery; ``read`` returns None where there is no battery."""

    name: str

    def read(self) -> BatteryReading | None: ...


class PsutilBattery:
    """``psutil.sensors_battery()``: macOS, Linux (``/sys/class/power_supply``), Windows, FreeBSD."""

    name = "psutil"

    def read(self) -> BatteryReading | None:
        import psutil

        if not hasattr(psutil, "sensors_battery"):
            return None
        try:
            raw = psutil.sensors_battery()
        except (OSError, RuntimeError):
            return None
        if raw is None:
            return None
        left = raw.secsleft if isinstance(raw.secsleft, int) and raw.secsleft >= 0 else None
        return BatteryReading(float(raw.percent), raw.power_plugged, left)


@runtime_checkable
class PressureSource(Protocol):
    """Anything that reads the OS memory-pressure level (1, 2, 4); None when it cannot tell."""

    name: str

    def read(self) -> int | None: ...


RUN_TIMEOUT_S = 5.0  # run_text's limit for one reading (sysctl answers in milliseconds)


def run_text(command: list[str], timeout: float | None = None) -> str | None:
    """stdout of a short command, or None when it fails, is missing or hangs (a hung one is killed
    and not waited for, with one warning line: ``laptrain.hardware.detect.run_probe``)."""
    done = run_probe(command, RUN_TIMEOUT_S if timeout is None else timeout)
    return done[1] if done and done[0] == 0 else None


class SysctlPressure:
    """``sysctl -n kern.memorystatus_vm_pressure_level`` (macOS; readable without root)."""

    name = "sysctl kern.memorystatus_vm_pressure_level"

    def __init__(self, run: Callable[[list[str]], str | None] = run_text) -> None:
        self._run, self._sysctl = run, sysctl_path()

    def read(self) -> int | None:
        text = self._run([self._sysctl, "-n", "kern.memorystatus_vm_pressure_level"])
        try:
            return int(text.strip()) if text else None
        except ValueError:
            return None


def pressure_source(platform: str = sys.platform) -> PressureSource | None:
    """The kernel's level on macOS; None elsewhere (Linux has PSI, which means something else)."""
    return SysctlPressure() if platform == "darwin" else None


@dataclass(frozen=True)
class ProcessMemory:
    name: str
    pid: int
    rss: int

    def text(self) -> str:
        return f"{self.name} (pid {self.pid}) {self.rss / 1024**3:.1f} GiB"


def top_processes(n: int = 3, exclude_pid: int | None = None) -> list[ProcessMemory]:
    """The ``n`` processes with the largest RSS, this one (``exclude_pid``) left out."""
    import psutil

    exclude_pid = os.getpid() if exclude_pid is None else exclude_pid
    found = []
    for proc in psutil.process_iter(["pid", "name", "memory_info"]):
        info = proc.info
        if info["pid"] == exclude_pid or info.get("memory_info") is None:
            continue  # another user's process may refuse its figures (AccessDenied -> None)
        found.append(ProcessMemory(info["name"] or "?", info["pid"], info["memory_info"].rss))
    return sorted(found, key=lambda p: p.rss, reverse=True)[:n]


def inhibit_command(
    pid: int, platform: str = sys.platform, which: Callable[[str], str | None] = shutil.which
) -> list[str] | None:
    """The command that holds off idle sleep until process ``pid`` exits (None where there is none):
    ``caffeinate -i -w pid`` on macOS (ends even on SIGKILL); ``systemd-inhibit`` around GNU
    ``tail --pid`` on Linux."""
    if platform == "darwin":
        return [which("caffeinate") or "/usr/bin/caffeinate", "-i", "-w", str(pid)]
    if platform.startswith("linux") and which("systemd-inhibit") and which("tail"):
        return [
            "systemd-inhibit",
            "--what=idle:sleep",
            "--who=laptrain",
            f"--why=training (pid {pid})",
            "--mode=block",
            "tail",
            f"--pid={pid}",
            "-f",
            "/dev/null",
        ]
    return None


def spawn(command: list[str]) -> subprocess.Popen:
    """Start the holder in its own session: a Ctrl-C in the terminal must not end it before the
    training process has saved and stopped (``GracefulStop``)."""
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


class KeepAwake:
    """Hold an idle-sleep assertion from ``start`` until ``stop`` (or this process's death);
    ``platform``, ``which``, ``spawn`` and ``sleep`` are injectable; ``settle_s``: how long to wait
    for a holder that fails at once (no D-Bus)."""

    def __init__(
        self,
        platform: str = sys.platform,
        which: Callable[[str], str | None] = shutil.which,
        spawn: Callable[[list[str]], Any] = spawn,
        settle_s: float = 0.2,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.platform, self.which, self.spawn = platform, which, spawn
        self.settle_s, self.sleep = settle_s, sleep
        self.command: list[str] | None = None
        self.process: Any = None

    @property
    def held(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, pid: int | None = None) -> str:
        """Start holding; return the one line that says what holds sleep off (or why nothing does)."""
        pid = os.getpid() if pid is None else pid
        self.command = inhibit_command(pid, self.platform, self.which)
        if self.command is None:
            return f"no sleep inhibitor on {self.platform} (caffeinate is macOS, systemd-inhibit not found)"
        shown = " ".join(self.command)
        try:
            self.process = self.spawn(self.command)
        except OSError as err:
            return f"could not start `{shown}` ({err}); the machine may sleep during training"
        self.sleep(self.settle_s)
        code = self.process.poll()
        if code is not None:
            why = _first_line(getattr(self.process, "stderr", None))
            self.process = None
            return (
                f"`{shown}` exited at once (code {code}{': ' + why if why else ''}); sleep not held"
            )
        return f"`{shown}` holds off idle sleep while training"

    def stop(self) -> None:
        """End the assertion (idempotent)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()


def _first_line(stream: Any) -> str:
    try:
        text = stream.read() if stream is not None else ""
    except (OSError, ValueError):
        return ""
    return text.strip().splitlines()[0] if text and text.strip() else ""
