import json
from pathlib import Path

from laptrain.cli import main
from laptrain.hardware.detect import RawMachine, machine_from_raw
from laptrain.hardware.doctor import (
    check_device,
    check_disk,
    check_quantization,
    check_watermarks,
    run_doctor,
)
from laptrain.hardware.profile import load_profile

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
        "training",
    ]


def test_exported_zero_watermark_fails_with_the_reason(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(HIGH, "0.0")
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert f"[FAIL] mps watermark: you exported {HIGH}=0.0" in out
    assert out.rstrip().splitlines()[-1] == "not ready: mps watermark, training failed (see above)"


def test_a_profile_for_another_device_fails_naming_the_fix(tmp_path):
    report = run_doctor("m2_air", environ={}, machine=recorded("linux_box"), output_dir=tmp_path)
    device = next(c for c in report.checks if c.name == "device")
    assert not report.ready and not device.ok
    assert (
        "hardware=m2_air needs mps" in device.detail
        and device.fix == "use hardware=auto (or hardware=cpu)"
    )


def test_apple_silicon_with_a_torch_without_mps_is_flagged():
    # The CI wheel is a Linux CPU build: exactly "a torch without MPS" for a recorded M2.
    check = check_device(recorded("m2_air"), load_profile("m2_air"))
    assert not check.ok and "no MPS on an Apple Silicon Mac" in check.detail


def test_watermark_traps():
    profile = load_profile("m2_air")
    assert check_watermarks(profile, {}).ok
    assert not check_watermarks(profile, {LOW: "0.9"}).ok  # LOW 0.9 > the profile's HIGH 0.8
    only_high = check_watermarks({"env": {}}, {HIGH: "0.8"})
    assert not only_high.ok and LOW in only_high.fix


def test_macos_without_bitsandbytes_is_a_warning_not_a_failure():
    check = check_quantization(recorded("m2_air"))
    assert check.ok and check.warning and "no 4-bit QLoRA" in check.detail


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
    from laptrain.cli import doctor as run_cli_doctor

    monkeypatch.setattr("laptrain.hardware.doctor.run_doctor", lambda *a, **k: _Ready())
    args = type("Args", (), {"record": str(tmp_path / "me"), "overrides": [], "json": False})()
    assert run_cli_doctor(args) == 0
    raw = RawMachine.from_dir(tmp_path / "me")
    assert machine_from_raw(raw).memory_bytes > 0


class _Ready:
    ready = True

    def text(self):
        return "ready"
