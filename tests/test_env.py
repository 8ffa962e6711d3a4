from laptrain.hardware.env import apply_env


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

    code = "import sys, laptrain.hardware.env, laptrain.hardware.auto, laptrain.run_dir; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"
