from pathlib import Path

import pytest

from laptrain.hardware.auto import choose_profile, resolve_hardware_argv
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
        ("intel_macbook", "macbook_cpu_16gb"),
        ("linux_box", "cpu"),
        ("cuda_host", "cuda"),
    ],
)
def test_each_recorded_machine_gets_its_profile(recording, profile):
    assert choose_profile(recorded(recording)).profile == profile


def test_auto_line_says_machine_device_profile_threads_and_batch():
    args, line = resolve_hardware_argv(["train.py"], detect=lambda: recorded("m2_air"))
    assert args == ["train.py", "hardware=m2_air"]
    assert line == (
        "hardware=auto: Apple M2, 16 GB, 4P+4E cores, MPS → m2_air (threads 4, batch from preflight)"
    )


def test_base_m4_falls_back_to_generic_mps_and_says_so():
    _, line = resolve_hardware_argv(["train.py", "hardware=auto"], detect=lambda: recorded("m4"))
    assert "→ mps" in line and "no profile for M4 base" in line
    assert "torch default = P cores" in line


def test_cpu_profile_gets_the_physical_core_count_unless_the_user_sets_threads():
    args, line = resolve_hardware_argv(["t.py", "x=1"], detect=lambda: recorded("linux_box"))
    assert args == ["t.py", "x=1", "hardware=cpu", "hardware.torch_threads=8"]
    assert "(threads 8, batch 16, checked by preflight)" in line
    mine = ["t.py", "hardware.torch_threads=3"]
    args, _ = resolve_hardware_argv(mine, detect=lambda: recorded("linux_box"))
    assert args == [*mine, "hardware=cpu"]


def test_intel_mac_by_memory_size_uses_seed_002_table():
    args, line = resolve_hardware_argv(["t.py"], detect=lambda: recorded("intel_macbook"))
    assert "hardware=macbook_cpu_16gb" in args and "hardware.torch_threads=6" in args
    assert line.startswith(
        "hardware=auto: Intel(R) Core(TM) i7-9750H CPU @ 2.60GHz, 16 GB, 6 cores"
    )


def test_explicit_profile_is_kept_with_a_note_when_the_machine_differs():
    argv = ["t.py", "hardware=m2_air"]
    args, note = resolve_hardware_argv(argv, detect=lambda: recorded("cuda_host"))
    assert args == argv
    assert note.startswith("note: hardware=m2_air was chosen")
    assert "would get hardware=cuda" in note
    assert resolve_hardware_argv(argv, detect=lambda: recorded("m2_air")) == (argv, None)


def test_every_profile_auto_can_choose_exists():
    for name in ("m1_mini", "m2_air", "m3_pro", "m4", "m5_max", "intel_macbook", "cuda_host"):
        assert load_profile(choose_profile(recorded(name)).profile)["name"]


def test_line_follows_a_batch_size_override():
    argv = ["t.py", "hardware.batch_size=auto"]
    _, line = resolve_hardware_argv(argv, detect=lambda: recorded("linux_box"))
    assert line.endswith("(threads 8, batch from preflight)")
