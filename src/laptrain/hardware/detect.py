"""What machine is this? Read without sudo and without importing torch (``hardware=auto`` resolves
before torch reads a profile's environment): ``sysctl`` and ``mac_ver()`` on macOS, ``/proc`` on
Linux, ``nvidia-smi``, and torch's ``version.py`` as text. Raw outputs go into a ``RawMachine``
parsed by pure functions, so tests feed recorded machines (tests/recordings/)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

# hw.perflevel* exist on Apple Silicon only; lower N = faster cores (Apple's sysctlbyname
# "Determining system capabilities"). sysctl.proc_translated is 1 in a process Rosetta 2 translates.
SYSCTL_KEYS = (
    "machdep.cpu.brand_string",
    "hw.memsize",
    "hw.physicalcpu",
    "hw.logicalcpu",
    "hw.nperflevels",
    "hw.perflevel0.physicalcpu",
    "hw.perflevel0.name",
    "hw.perflevel1.physicalcpu",
    "hw.perflevel1.name",
    "sysctl.proc_translated",
)
# Where macOS keeps sysctl (the sealed system volume). A Python started by launchd, cron or an IDE
# may have a PATH without /usr/sbin, and a bare "sysctl" then finds nothing.
SYSCTL = "/usr/sbin/sysctl"
NVIDIA_SMI_QUERY = ("--query-gpu=name,memory.total", "--format=csv,noheader,nounits")
GiB = 1024**3
PROBE_TIMEOUT_S = 10.0  # nvidia-smi, sysctl, sw_vers: each answers in well under a second


@dataclass(frozen=True)
class RawMachine:
    """Raw command and file outputs, exactly as the OS printed them (empty when absent)."""

    system: str  # platform.system(): "Darwin", "Linux", ...
    arch: str  # platform.machine(): "arm64", "x86_64", ...
    sysctl: str = ""
    cpuinfo: str = ""
    meminfo: str = ""
    nvidia_smi: str = ""
    mac_ver: str = ""  # platform.mac_ver()[0], e.g. "14.5"; empty off macOS
    torch_version_py: str = ""  # the text of the installed torch/version.py; empty if none

    _FILES: ClassVar[dict[str, str]] = {
        "sysctl": "sysctl.txt",
        "cpuinfo": "cpuinfo.txt",
        "meminfo": "meminfo.txt",
        "nvidia_smi": "nvidia-smi.txt",
        "mac_ver": "mac_ver.txt",
        "torch_version_py": "torch-version.py.txt",
    }

    @classmethod
    def from_dir(cls, folder: str | Path) -> RawMachine:
        """Read a recording: ``uname.txt`` ("Darwin arm64") plus one file per output."""
        folder = Path(folder)
        system, _, arch = (folder / "uname.txt").read_text().strip().partition(" ")
        texts = {key: _read(str(folder / name)) for key, name in cls._FILES.items()}
        return cls(system=system, arch=arch, **texts)

    def write_dir(self, folder: str | Path) -> None:
        """Write this machine's outputs in the layout ``from_dir`` reads."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "uname.txt").write_text(f"{self.system} {self.arch}\n")
        for key, name in self._FILES.items():
            if getattr(self, key):
                (folder / name).write_text(getattr(self, key))


@dataclass(frozen=True)
class GpuInfo:
    name: str
    memory_bytes: int


@dataclass(frozen=True)
class MachineInfo:
    """The facts a profile choice needs."""

    system: str
    arch: str
    cpu: str
    memory_bytes: int
    physical_cores: int
    performance_cores: int | None = None
    efficiency_cores: int | None = None
    gpus: tuple[GpuInfo, ...] = field(default_factory=tuple)
    macos_version: str = ""  # "13.6.1"; empty off macOS or when unknown
    rosetta: bool = False  # an x86_64 process translated by Rosetta 2 on an Apple Silicon Mac
    torch_version: str = ""  # the installed torch, e.g. "2.13.0+cpu"; empty when not found
    torch_cuda: bool | None = None  # torch built with CUDA; None when unknown

    @property
    def apple_silicon(self) -> bool:
        return self.system == "Darwin" and self.arch == "arm64"

    @property
    def intel_mac(self) -> bool:
        """An x86_64 macOS process: an Intel Mac, or an x86_64 Python under Rosetta."""
        return self.system == "Darwin" and self.arch == "x86_64"

    @property
    def macos_major(self) -> int | None:
        """14 for "14.5"; None off macOS or when the version is unknown."""
        match = re.match(r"(\d+)", self.macos_version)
        return int(match.group(1)) if self.system == "Darwin" and match else None

    @property
    def apple_chip(self) -> tuple[int, str] | None:
        """(generation, tier) of an Apple chip, e.g. "Apple M4 Max" -> (4, "max"); None otherwise."""
        match = re.match(r"Apple M(\d+)(?:\s+(Pro|Max|Ultra))?\b", self.cpu)
        if not self.apple_silicon or not match:
            return None
        return int(match.group(1)), (match.group(2) or "base").lower()

    @property
    def memory_gb(self) -> int:
        """Installed memory in marketing GB: Apple's "16 GB" is 16 GiB, so bytes / 2^30, rounded."""
        return round(self.memory_bytes / GiB)

    def cores_text(self) -> str:
        if self.performance_cores and self.efficiency_cores:
            return f"{self.performance_cores}P+{self.efficiency_cores}E cores"
        return f"{self.physical_cores} cores"

    def summary(self) -> str:
        """E.g. "Apple M2, 16 GB, 4P+4E cores" (", macOS 14.5" when the version is known)."""
        macos = f", macOS {self.macos_version}" if self.macos_major else ""
        return f"{self.cpu}, {self.memory_gb} GB, {self.cores_text()}{macos}"


def parse_sysctl(text: str) -> dict[str, str]:
    """``sysctl key ...`` prints ``key: value`` lines; unknown keys go to stderr and are absent."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() != "sysctl":  # "sysctl: unknown oid ..." is an error line
            values[key.strip()] = value.strip()
    return values


def parse_cpuinfo(text: str) -> tuple[str, int, int]:
    """(CPU model, physical cores, logical CPUs) from /proc/cpuinfo; cores are distinct (physical
    id, core id) pairs, or every logical CPU where a kernel omits them."""
    model = ""
    logical = 0
    cores: set[tuple[str, str]] = set()
    physical_id = core_id = ""
    for line in [*text.splitlines(), ""]:
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "processor":
            logical += 1
        elif key == "model name" and not model:
            model = value
        elif key == "physical id":
            physical_id = value
        elif key == "core id":
            core_id = value
        elif not line.strip() and core_id:
            cores.add((physical_id, core_id))
            physical_id = core_id = ""
    return model or "unknown CPU", len(cores) or logical, logical


def parse_meminfo(text: str) -> int:
    """MemTotal from /proc/meminfo, in bytes."""
    match = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else 0


def parse_nvidia_smi(text: str) -> tuple[GpuInfo, ...]:
    """``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits`` (MiB)."""
    gpus = []
    for line in text.splitlines():
        name, sep, mib = line.rpartition(",")
        if sep and mib.strip().isdigit():
            gpus.append(GpuInfo(name.strip(), int(mib.strip()) * 1024**2))
    return tuple(gpus)


def parse_torch_version_py(text: str) -> tuple[str, bool | None]:
    """(torch version, built with CUDA?) from ``torch/version.py``'s ``cuda:`` line, else the local
    tag ("+cpu", "+cu126"); a plain PyPI version says nothing (None)."""
    version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    version_text = version.group(1) if version else ""
    cuda = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*(.+?)\s*$", text, re.MULTILINE)
    if cuda:
        return version_text, cuda.group(1) != "None"
    local = version_text.partition("+")[2]
    if local == "cpu":
        return version_text, False
    if local.startswith("cu"):
        return version_text, True
    return version_text, None


def machine_from_raw(raw: RawMachine) -> MachineInfo:
    """Parse the raw outputs of one machine."""
    gpus = parse_nvidia_smi(raw.nvidia_smi)
    torch_version, torch_cuda = parse_torch_version_py(raw.torch_version_py)
    torch_facts = {"torch_version": torch_version, "torch_cuda": torch_cuda}
    if raw.system == "Darwin":
        values = parse_sysctl(raw.sysctl)
        levels = int(values.get("hw.nperflevels", "1") or 1)
        perf = values.get("hw.perflevel0.physicalcpu")
        eff = values.get("hw.perflevel1.physicalcpu")
        return MachineInfo(
            system=raw.system,
            arch=raw.arch,
            cpu=values.get("machdep.cpu.brand_string", "unknown Mac"),
            memory_bytes=int(values.get("hw.memsize", "0") or 0),
            physical_cores=int(values.get("hw.physicalcpu", "0") or 0),
            performance_cores=int(perf) if perf and levels > 1 else None,
            efficiency_cores=int(eff) if eff and levels > 1 else None,
            gpus=gpus,
            macos_version=raw.mac_ver.strip(),
            rosetta=values.get("sysctl.proc_translated") == "1",
            **torch_facts,
        )
    model, physical, _ = parse_cpuinfo(raw.cpuinfo)
    return MachineInfo(
        system=raw.system,
        arch=raw.arch,
        cpu=model,
        memory_bytes=parse_meminfo(raw.meminfo),
        physical_cores=physical,
        gpus=gpus,
        **torch_facts,
    )


def _warn(line: str) -> None:
    print(line, file=sys.stderr)


# Commands that once hung past their timeout: asked again, they are not run (a wedged driver stays
# wedged, and each try would leave one more unkillable child behind).
WEDGED: set[tuple[str, ...]] = set()


def run_probe(
    command: list[str], timeout: float, warn: Callable[[str], None] = _warn
) -> tuple[int, str] | None:
    """(exit code, stdout) of a short probe command; None when it is missing, fails or exceeds
    ``timeout``. ``subprocess.run(timeout=)`` waits without limit for the killed child (CPython's
    ``run``), and a wedged ``nvidia-smi`` in uninterruptible sleep is never reaped: here a daemon
    thread reaps it and one warning line names the command."""
    key = tuple(command)
    if key in WEDGED:
        return None
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        WEDGED.add(key)
        with contextlib.suppress(OSError):
            process.kill()
        threading.Thread(target=_reap, args=(process,), name="probe-reaper", daemon=True).start()
        warn(
            f"warning: `{shlex.join(command)}` did not answer within {timeout:g} s and was killed "
            "(a hung driver or service?); its reading is taken as unknown"
        )
        return None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return process.returncode, out


def _reap(process: subprocess.Popen) -> None:
    """Wait for a killed probe (forever, if it never dies: a daemon thread, so the process may
    exit regardless)."""
    with contextlib.suppress(Exception):
        process.communicate()


def _run(command: list[str], timeout: float | None = None) -> str:
    """stdout of a command, or "" when it is missing, fails to start or hangs."""
    if not shutil.which(command[0]):
        return ""
    done = run_probe(command, PROBE_TIMEOUT_S if timeout is None else timeout)
    return done[1] if done else ""


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def read_torch_version_py() -> str:
    """The installed torch's ``torch/version.py`` as text, found without importing torch."""
    try:
        spec = importlib.util.find_spec("torch")  # a top-level find runs no torch code
    except (ImportError, ValueError):
        return ""
    for folder in (spec and spec.submodule_search_locations) or ():
        text = _read(os.path.join(folder, "version.py"))
        if text:
            return text
    return ""


def sysctl_path(which: Callable[[str], str | None] = shutil.which) -> str:
    """``sysctl`` as PATH finds it, else macOS's ``/usr/sbin/sysctl`` (as ``caffeinate`` is found)."""
    return which("sysctl") or SYSCTL


def read_mac_version() -> str:
    """macOS's version, e.g. "14.5". A Python built against an old SDK is told "10.16" on macOS 11+
    (Apple's compatibility answer), so then ``sw_vers`` asks the OS itself."""
    version = platform.mac_ver()[0]
    if version == "10.16":
        version = _run(["sw_vers", "-productVersion"]).strip() or ""
    return version


def read_raw_machine() -> RawMachine:
    """Collect this machine's raw outputs (no sudo, no torch import)."""
    system, arch = platform.system(), platform.machine()
    nvidia = ""
    if os.environ.get("CUDA_VISIBLE_DEVICES") != "":
        nvidia = _run(["nvidia-smi", *NVIDIA_SMI_QUERY])
    torch_text = read_torch_version_py()
    if system == "Darwin":
        return RawMachine(
            system,
            arch,
            sysctl=_run([sysctl_path(), *SYSCTL_KEYS]),
            nvidia_smi=nvidia,
            mac_ver=read_mac_version(),
            torch_version_py=torch_text,
        )
    return RawMachine(
        system,
        arch,
        cpuinfo=_read("/proc/cpuinfo"),
        meminfo=_read("/proc/meminfo"),
        nvidia_smi=nvidia,
        torch_version_py=torch_text,
    )


def detect_machine() -> MachineInfo:
    """This machine's facts; falls back to psutil where /proc is missing (BSDs, containers)."""
    machine = machine_from_raw(read_raw_machine())
    if machine.memory_bytes and machine.physical_cores:
        return machine
    import psutil

    return replace(
        machine,
        memory_bytes=machine.memory_bytes or psutil.virtual_memory().total,
        physical_cores=machine.physical_cores or psutil.cpu_count(logical=False) or 1,
    )
