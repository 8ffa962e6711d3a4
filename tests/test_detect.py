from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest

from laptrain.hardware import detect
from laptrain.hardware.detect import (
    RawMachine,
    machine_from_raw,
    parse_cpuinfo,
    parse_meminfo,
    parse_nvidia_smi,
    parse_sysctl,
    parse_torch_version_py,
    read_raw_machine,
    sysctl_path,
)

RECORDINGS = Path(__file__).parent / "recordings"
GiB = 1024**3


def recorded(name: str):
    return machine_from_raw(RawMachine.from_dir(RECORDINGS / name))


@pytest.mark.parametrize(
    ("name", "cpu", "memory_gb", "cores", "apple_chip"),
    [
        ("m1_mini", "Apple M1", 16, "4P+4E cores", (1, "base")),
        ("m2_air", "Apple M2", 16, "4P+4E cores", (2, "base")),
        ("m3_pro", "Apple M3 Pro", 18, "5P+6E cores", (3, "pro")),
        ("m4", "Apple M4", 16, "4P+6E cores", (4, "base")),
        ("m5_max", "Apple M5 Max", 64, "6P+12E cores", (5, "max")),
        ("m1_air_macos13", "Apple M1", 8, "4P+4E cores", (1, "base")),
        ("intel_macbook", "Intel(R) Core(TM) i7-9750H CPU @ 2.60GHz", 16, "6 cores", None),
        ("linux_box", "AMD Ryzen 7 5800X 8-Core Processor", 31, "8 cores", None),
        ("cuda_host", "AMD Ryzen 9 7950X 16-Core Processor", 62, "16 cores", None),
    ],
)
def test_recordings_parse_to_the_machine_they_describe(name, cpu, memory_gb, cores, apple_chip):
    machine = recorded(name)
    assert machine.cpu == cpu
    assert machine.memory_gb == memory_gb
    assert machine.cores_text() == cores
    assert machine.apple_chip == apple_chip


def test_every_recording_says_where_it_came_from():
    folders = [p for p in RECORDINGS.iterdir() if p.is_dir()]
    assert len(folders) >= 8
    for folder in folders:
        assert len((folder / "SOURCE.md").read_text().split()) > 10, folder.name


def test_cuda_host_lists_its_gpu_with_memory():
    (gpu,) = recorded("cuda_host").gpus
    assert gpu.name == "NVIDIA GeForce RTX 4090"
    assert gpu.memory_bytes == 24564 * 1024**2


def test_sysctl_ignores_unknown_oid_errors_and_keeps_values_with_colons():
    text = "machdep.cpu.brand_string: Apple M2\nsysctl: unknown oid 'hw.perflevel0.physicalcpu'\n"
    assert parse_sysctl(text) == {"machdep.cpu.brand_string": "Apple M2"}


def test_intel_mac_has_no_core_split_even_if_one_level_is_reported():
    raw = RawMachine(
        "Darwin",
        "x86_64",
        sysctl="machdep.cpu.brand_string: Intel i5\nhw.memsize: 8589934592\nhw.physicalcpu: 4\n"
        "hw.nperflevels: 1\nhw.perflevel0.physicalcpu: 4\n",
    )
    machine = machine_from_raw(raw)
    assert machine.performance_cores is None
    assert machine.summary() == "Intel i5, 8 GB, 4 cores"


def test_cpuinfo_without_core_ids_counts_logical_cpus():
    text = "processor : 0\nmodel name : ARM board\n\nprocessor : 1\nmodel name : ARM board\n"
    assert parse_cpuinfo(text) == ("ARM board", 2, 2)


def test_hyperthreads_are_not_counted_as_cores():
    _, physical, logical = parse_cpuinfo((RECORDINGS / "linux_box" / "cpuinfo.txt").read_text())
    assert (physical, logical) == (8, 16)


def test_meminfo_and_nvidia_smi_tolerate_missing_output():
    assert parse_meminfo("") == 0
    assert parse_nvidia_smi("") == ()
    assert parse_nvidia_smi("NVIDIA A100-SXM4-80GB, 81920\n")[0].memory_bytes == 80 * GiB


def test_recording_round_trips_through_a_folder(tmp_path):
    raw = RawMachine.from_dir(RECORDINGS / "cuda_host")
    raw.write_dir(tmp_path / "copy")
    assert RawMachine.from_dir(tmp_path / "copy") == raw


def test_macos_version_and_rosetta_come_from_the_recording():
    m1 = recorded("m1_air_macos13")
    assert (m1.macos_version, m1.macos_major, m1.rosetta) == ("13.6.1", 13, False)
    assert m1.summary() == "Apple M1, 8 GB, 4P+4E cores, macOS 13.6.1"
    assert recorded("m2_air").macos_major is None  # not recorded: unknown, not "old"
    assert recorded("intel_macbook").intel_mac and not recorded("m2_air").intel_mac
    translated = RawMachine("Darwin", "x86_64", sysctl="sysctl.proc_translated: 1\n")
    assert machine_from_raw(translated).rosetta


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # the file a torch build writes (this venv's 2.13.0+cpu)
        (
            "__version__ = '2.13.0+cpu'\ndebug = False\ncuda: Optional[str] = None\n",
            ("2.13.0+cpu", False),
        ),
        ("__version__ = '2.13.0'\ncuda: Optional[str] = '12.8'\n", ("2.13.0", True)),
        ("__version__ = '2.4.1'\ncuda = '12.1'\n", ("2.4.1", True)),
        # no cuda line: the local version tag decides, a plain version is unknown
        ("__version__ = '2.13.0+cu126'\n", ("2.13.0+cu126", True)),
        ("__version__ = '2.13.0+cpu'\n", ("2.13.0+cpu", False)),
        ("__version__ = '2.13.0'\n", ("2.13.0", None)),
        ("", ("", None)),
    ],
)
def test_torch_build_is_read_from_version_py_text(text, expected):
    assert parse_torch_version_py(text) == expected


def test_detection_reads_this_torch_without_importing_it():
    import subprocess
    import sys

    code = (
        "import sys; from laptrain.hardware.detect import detect_machine; m = detect_machine(); "
        "print('torch' in sys.modules, m.torch_version, m.torch_cuda)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    import importlib.metadata

    assert out == ["False", importlib.metadata.version("torch"), "False"]  # the CI wheel is +cpu


def test_a_mac_whose_path_lacks_usr_sbin_still_runs_sysctl(monkeypatch, tmp_path):
    """Without /usr/sbin on PATH a bare "sysctl" finds nothing and the Mac reads as a bare CPU."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(detect.platform, "system", lambda: "Darwin")
    asked = []
    monkeypatch.setattr(detect, "_run", lambda command: asked.append(command) or "")
    read_raw_machine()
    assert ["/usr/sbin/sysctl", *detect.SYSCTL_KEYS] in asked
    # a sysctl that PATH finds is the one run, as for caffeinate
    assert sysctl_path(which=lambda name: f"/opt/tools/{name}") == "/opt/tools/sysctl"


class WedgedProbe:
    """A ``subprocess.Popen`` stand-in for a probe stuck in the kernel (a wedged ``nvidia-smi``):
    it never answers, and killing it does not end it (uninterruptible sleep), so a wait without a
    timeout blocks until the test releases it at teardown."""

    made: ClassVar[list[WedgedProbe]] = []

    def __init__(self, args, **kwargs) -> None:
        self.args, self.killed, self.returncode, self.pid = args, False, None, 12345
        self.released = threading.Event()
        self.made.append(self)

    def communicate(self, input=None, timeout=None):
        self._block(timeout)
        return "", ""

    def wait(self, timeout=None):
        self._block(timeout)
        return -9

    def _block(self, timeout) -> None:
        if not self.released.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)

    def kill(self) -> None:
        self.killed = True

    def poll(self):
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.wait()


@pytest.fixture
def wedged(monkeypatch):
    WedgedProbe.made.clear()
    monkeypatch.setattr(subprocess, "Popen", WedgedProbe)
    monkeypatch.setattr(detect.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(detect, "WEDGED", set(), raising=False)
    yield WedgedProbe.made
    for probe in WedgedProbe.made:  # let the threads that still wait on it end
        probe.released.set()


def finishes_within(seconds: float, call):
    """``call()``'s result, or an AssertionError if it is still running after ``seconds``."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return result[0], time.monotonic() - started


def test_a_probe_that_hangs_in_the_kernel_is_killed_reported_and_read_as_unknown(
    wedged, monkeypatch, capsys
):
    """nvidia-smi stuck in the driver: subprocess.run(timeout=) kills it, then waits for it without
    limit. The probe must return within its timeout, say so in one line, and read "no GPU"."""
    monkeypatch.setattr(detect, "PROBE_TIMEOUT_S", 0.5, raising=False)
    monkeypatch.setattr(detect.platform, "system", lambda: "Linux")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    raw, took = finishes_within(3, read_raw_machine)
    assert took < 2.5 and raw.nvidia_smi == "" and machine_from_raw(raw).gpus == ()
    assert [p.args[0] for p in wedged] == ["nvidia-smi"] and wedged[0].killed
    lines = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(lines) == 1, lines
    assert lines[0].startswith("warning: `nvidia-smi --query-gpu=name,memory.total")
    assert "did not answer within 0.5 s" in lines[0] and "unknown" in lines[0]
    # asked again (doctor after hardware=auto), the wedged command is not started again
    raw, _ = finishes_within(1, read_raw_machine)
    assert raw.nvidia_smi == "" and len(wedged) == 1 and capsys.readouterr().err == ""


def test_a_hung_memory_pressure_reading_is_none_within_its_timeout(wedged, monkeypatch, capsys):
    from laptrain.hardware import power

    monkeypatch.setattr(power, "RUN_TIMEOUT_S", 0.5, raising=False)
    level, _ = finishes_within(3, power.SysctlPressure().read)
    assert level is None and wedged[0].killed
    assert "did not answer within 0.5 s" in capsys.readouterr().err
