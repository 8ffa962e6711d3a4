import pytest

from laptrain.hardware.env import WatermarkError, apply_env, resolve_watermarks


def test_profile_values_are_set_and_exported_values_win():
    environ = {"OMP_NUM_THREADS": "2"}
    report = apply_env(
        {"OMP_NUM_THREADS": "4", "PYTORCH_ENABLE_MPS_FALLBACK": 1, "SKIP": None}, environ
    )
    assert environ == {"OMP_NUM_THREADS": "2", "PYTORCH_ENABLE_MPS_FALLBACK": "1"}
    assert report.applied == {"PYTORCH_ENABLE_MPS_FALLBACK": "1"}
    assert report.kept == {"OMP_NUM_THREADS": "2"}
    assert any("exported by you" in line for line in report.lines())


def test_env_module_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, laptrain.hardware.env, laptrain.hardware.auto, laptrain.run_folder.naming; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


HIGH, LOW = "PYTORCH_MPS_HIGH_WATERMARK_RATIO", "PYTORCH_MPS_LOW_WATERMARK_RATIO"
MPS_ENV = {"PYTORCH_ENABLE_MPS_FALLBACK": "1", HIGH: "0.8", LOW: "0.7"}  # conf/hardware/mps.yaml


def test_exported_high_below_the_profiles_low_lowers_low_with_one_line():
    environ = {HIGH: "0.5"}
    report = apply_env(MPS_ENV, environ)
    assert environ[LOW] == "0.4375" and environ[HIGH] == "0.5"
    assert report.applied[LOW] == "0.4375"
    assert report.notes == [
        f"env {LOW}=0.4375: lowered from the profile's 0.7 to 0.875 x your {HIGH}=0.5, "
        "because torch's MPS allocator refuses LOW > HIGH"
    ]
    assert f"env {LOW}=0.4375 (lowered to stay <= HIGH)" in report.lines()


def test_exported_high_without_any_low_lowers_torchs_default():
    environ = {HIGH: "0.8"}
    report = apply_env({}, environ)  # torch's LOW default on Apple Silicon is 1.4 > 0.8
    assert environ[LOW] == "0.7" and "torch's default 1.4" in report.notes[0]


def test_both_exported_inconsistently_is_refused_naming_both():
    environ = {HIGH: "0.5", LOW: "0.6"}
    with pytest.raises(WatermarkError) as err:
        apply_env(MPS_ENV, environ)
    message = str(err.value)
    assert HIGH in message and LOW in message and "\n" not in message
    assert isinstance(err.value, ValueError)  # train.py's `error:` path, exit 2
    assert environ == {HIGH: "0.5", LOW: "0.6"}  # nothing applied
    with pytest.raises(WatermarkError, match="above the profile's"):
        apply_env(MPS_ENV, {LOW: "0.9"})  # LOW 0.9 > the profile's HIGH 0.8


def test_exported_zero_high_warns_once_and_allows_any_low():
    report = apply_env(MPS_ENV, {HIGH: "0.0"})
    assert len(report.notes) == 1 and report.notes[0].startswith(
        f"warning: you exported {HIGH}=0.0"
    )
    assert apply_env(MPS_ENV, {HIGH: "0.0", LOW: "1.9"}).notes == report.notes


@pytest.mark.parametrize("value", ["abc", "2.5", "-1"])
def test_a_ratio_torch_would_refuse_or_misread_is_refused(value):
    with pytest.raises(WatermarkError, match="not a number between 0 and 2"):
        apply_env(MPS_ENV, {HIGH: value})


def test_consistent_or_absent_watermarks_say_nothing():
    assert apply_env(MPS_ENV, {}).notes == []
    assert apply_env({}, {}).notes == []  # torch's defaults 1.7 / 1.4
    assert resolve_watermarks(MPS_ENV, {HIGH: "0.9"}).ok


def test_train_py_refuses_bad_watermarks_with_one_error_line(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, HIGH: "0.5", LOW: "0.6"}
    env.pop("LAPTRAIN_TRACEBACK", None)
    done = subprocess.run(
        [sys.executable, "train.py", "hardware=mps", f"hydra.run.dir={tmp_path}"],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert HIGH in line and LOW in line
