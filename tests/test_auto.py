from dataclasses import replace
from pathlib import Path

import pytest

from laptrain.hardware.auto import (
    UnsupportedMachine,
    choose_profile,
    describe,
    resolve_hardware_argv,
)
from laptrain.hardware.detect import MachineInfo, RawMachine, machine_from_raw
from laptrain.hardware.profile import load_profile

RECORDINGS = Path(__file__).parent / "recordings"


def recorded(name: str) -> MachineInfo:
    return machine_from_raw(RawMachine.from_dir(RECORDINGS / name))


@pytest.mark.parametrize(
    ("recording", "profile"),
    [
        ("m1_mini", "m1_mini"),
        ("m2_air", "m2_air"),
        ("m3_pro", "m3_pro"),
        ("m4", "mps"),
        ("m5_max", "m5_max"),
        ("m1_air_macos13", "macbook_cpu_8gb"),
        ("linux_box", "cpu"),
        ("cuda_host", "cuda"),
    ],
)
def test_each_recorded_machine_gets_its_profile(recording, profile):
    assert choose_profile(recorded(recording)).profile == profile


def test_auto_line_says_machine_device_and_profile_once():
    args, line = resolve_hardware_argv(["train.py"], detect=lambda: recorded("m2_air"))
    assert args == ["train.py", "hardware=m2_air"]
    # threads and batch are the run summary's lines (with their reasons), not repeated here
    assert line == "hardware=auto: Apple M2, 16 GB, 4P+4E cores, MPS → m2_air"
    choice = choose_profile(recorded("m2_air"))
    assert describe(choice, load_profile("m2_air"), None).endswith(
        "→ m2_air (threads 4, batch from preflight)"
    )  # laptrain doctor's fuller line


def test_base_m4_falls_back_to_generic_mps_and_says_so():
    _, line = resolve_hardware_argv(["train.py", "hardware=auto"], detect=lambda: recorded("m4"))
    assert "→ mps" in line and "no profile for M4 base" in line
    assert line.endswith("→ mps (no profile for M4 base, generic MPS)")


def test_cpu_profile_gets_the_physical_core_count_unless_the_user_sets_threads():
    args, line = resolve_hardware_argv(["t.py", "x=1"], detect=lambda: recorded("linux_box"))
    assert args == ["t.py", "x=1", "hardware=cpu", "hardware.torch_threads=8"]
    assert line.endswith("no GPU → cpu")
    mine = ["t.py", "hardware.torch_threads=3"]
    args, _ = resolve_hardware_argv(mine, detect=lambda: recorded("linux_box"))
    assert args == [*mine, "hardware=cpu"]


def test_intel_mac_is_refused_in_one_line_naming_the_wheels():
    with pytest.raises(UnsupportedMachine) as err:
        resolve_hardware_argv(["t.py"], detect=lambda: recorded("intel_macbook"))
    assert str(err.value) == (
        "Intel Macs are not supported: PyTorch publishes no macOS x86_64 wheels after 2.2.2 and "
        "laptrain needs torch>=2.13"
    )
    assert isinstance(err.value, ValueError)  # train.py's `error:` path, exit 2
    # an explicit profile is the user's call: no refusal, no note
    argv = ["t.py", "hardware=cpu"]
    assert resolve_hardware_argv(argv, detect=lambda: recorded("intel_macbook")) == (argv, None)


def test_x86_python_under_rosetta_on_apple_silicon_is_told_to_use_an_arm64_python():
    rosetta = replace(recorded("m2_air"), arch="x86_64", rosetta=True)
    with pytest.raises(UnsupportedMachine, match="under Rosetta.*install an arm64 Python"):
        choose_profile(rosetta)


def test_apple_silicon_mps_off_profiles_by_memory_size_use_seed_002_table():
    m1 = recorded("m1_air_macos13")
    for gb, name in ((8, "macbook_cpu_8gb"), (16, "macbook_cpu_16gb"), (64, "macbook_cpu_32gb")):
        assert choose_profile(replace(m1, memory_bytes=gb * 1024**3)).profile == name
        assert "Apple Silicon" in load_profile(name)["machine"]


def test_macos_13_gets_the_cpu_profile_and_says_why():
    args, line = resolve_hardware_argv(["t.py"], detect=lambda: recorded("m1_air_macos13"))
    assert args == ["t.py", "hardware=macbook_cpu_8gb", "hardware.torch_threads=4"]
    assert line == (
        "hardware=auto: Apple M1, 8 GB, 4P+4E cores, macOS 13.6.1, no MPS → macbook_cpu_8gb "
        "(macOS 13.6.1 < 14: torch's MPS needs macOS 14; training on CPU)"
    )
    # macOS 14 and 15 keep MPS; an unknown version (old recordings) is not held against the Mac
    for version in ("14.0", "15.3.1", ""):
        machine = replace(recorded("m1_air_macos13"), macos_version=version)
        assert choose_profile(machine).device == "MPS"
    # an explicit MPS profile on macOS 13 is kept, with a note saying why it will not run
    argv = ["t.py", "hardware=m1_mini"]
    _, note = resolve_hardware_argv(argv, detect=lambda: recorded("m1_air_macos13"))
    assert "would get hardware=macbook_cpu_8gb (macOS 13.6.1 < 14" in note


CPU_TORCH = "__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n"
CUDA_TORCH = "__version__ = '2.13.0'\ncuda: Optional[str] = '12.8'\n"


def with_torch(name: str, version_py: str) -> MachineInfo:
    return machine_from_raw(
        replace(RawMachine.from_dir(RECORDINGS / name), torch_version_py=version_py)
    )


def test_gpu_with_a_cpu_only_torch_gets_the_cpu_profile_and_the_install_line():
    args, line = resolve_hardware_argv(["t.py"], detect=lambda: with_torch("cuda_host", CPU_TORCH))
    assert args == ["t.py", "hardware=cpu", "hardware.torch_threads=16"]
    assert "no CUDA in torch → cpu" in line
    assert "torch 2.13.0+cpu is built without CUDA; training on CPU" in line
    assert "pip install torch --index-url https://download.pytorch.org/whl/cu" in line
    assert choose_profile(with_torch("cuda_host", CUDA_TORCH)).profile == "cuda"
    assert choose_profile(with_torch("cuda_host", "")).profile == "cuda"  # unknown: trust the GPU


def test_explicit_profile_is_kept_with_a_note_when_the_machine_differs():
    argv = ["t.py", "hardware=m2_air"]
    args, note = resolve_hardware_argv(argv, detect=lambda: recorded("cuda_host"))
    assert args == argv
    assert note.startswith("note: hardware=m2_air was chosen")
    assert "would get hardware=cuda" in note
    assert resolve_hardware_argv(argv, detect=lambda: recorded("m2_air")) == (argv, None)


def test_every_profile_auto_can_choose_exists():
    for name in ("m1_mini", "m2_air", "m3_pro", "m4", "m5_max", "m1_air_macos13", "cuda_host"):
        assert load_profile(choose_profile(recorded(name)).profile)["name"]


def test_doctor_line_follows_the_profile_batch():
    choice = choose_profile(recorded("linux_box"))
    line = describe(choice, {**load_profile("cpu"), "batch_size": "auto"}, 8)
    assert line.endswith("(threads 8, batch from preflight)")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["t.py", "model=trm_sudoku", "data=sudoku", "--cfg", "job"],
            [
                "t.py",
                "model=trm_sudoku",
                "data=sudoku",
                "hardware=cpu",
                "hardware.torch_threads=8",
                "--cfg",
                "job",
            ],
        ),
        (
            ["t.py", "-m", "model.optimizer.lr=1e-4,3e-4", "--cfg", "job"],
            [
                "t.py",
                "-m",
                "model.optimizer.lr=1e-4,3e-4",
                "hardware=cpu",
                "hardware.torch_threads=8",
                "--cfg",
                "job",
            ],
        ),
        (["t.py", "--info"], ["t.py", "hardware=cpu", "hardware.torch_threads=8", "--info"]),
        (
            ["t.py", "--cfg", "job", "hardware=auto", "x=1"],
            ["t.py", "--cfg", "job", "hardware=cpu", "hardware.torch_threads=8", "x=1"],
        ),
    ],
)
def test_auto_overrides_go_where_hydra_accepts_them(argv, expected):
    args, _ = resolve_hardware_argv(argv, detect=lambda: recorded("linux_box"))
    assert args == expected


def test_train_py_on_an_intel_mac_exits_2_with_one_error_line():
    import subprocess
    import sys

    code = (
        "import runpy, sys; import laptrain.hardware.auto as a; "
        "from laptrain.hardware.detect import RawMachine, machine_from_raw; "
        f"m = machine_from_raw(RawMachine.from_dir({str(RECORDINGS / 'intel_macbook')!r})); "
        "a.resolve_hardware_argv.__defaults__ = (lambda: m, a.load_profile); "
        "sys.argv = ['train.py', '--cfg', 'job']; runpy.run_path('train.py', run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=RECORDINGS.parents[1],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert (
        done.stderr.strip() == "error: Intel Macs are not supported: PyTorch publishes no "
        "macOS x86_64 wheels after 2.2.2 and laptrain needs torch>=2.13"
    )
