"""run.py's glue: the device check that opens every run."""

from __future__ import annotations

import pytest

from laptrain.hardware.profile import ProfileError
from laptrain.job import run
from laptrain.launch import device
from laptrain.launch.device import FUSED_ON_MPS_FP16, FUSED_UNDER_FSDP_FP16, check_device
from tests.conftest import TINY, compose_train, write_texts
from tests.fakes import FakeProbe
from tests.in_process import train_here

UNFUSED_ON_MPS_FP16 = f"model.optimizer.fused=false {FUSED_ON_MPS_FP16}"
UNFUSED_UNDER_FSDP_FP16 = f"model.optimizer.fused=false {FUSED_UNDER_FSDP_FP16}"

SHARDED = "tests.sharded_on_cpu.ShardedOnCPU"  # a subclass of Lightning's FSDPStrategy


def test_16_mixed_on_cpu_is_refused_with_the_preflight_off():
    """Lightning would silently run bf16-mixed; the check runs whether or not the preflight does."""
    cfg = compose_train(["hardware=cpu", "preflight.enabled=false", "hardware.precision=16-mixed"])
    with pytest.raises(ProfileError, match="set hardware.precision=bf16-mixed"):
        check_device(cfg, FakeProbe(kind="cpu"))


def test_a_profile_for_a_device_this_machine_lacks_is_refused_naming_hardware_auto():
    cfg = compose_train(["hardware=m2_air"])
    with pytest.raises(ProfileError, match="hardware=auto"):
        check_device(cfg, FakeProbe(kind="mps", is_available=False))


def test_16_mixed_on_mps_runs_with_one_warning():
    said: list[str] = []
    cfg = compose_train(["hardware=m2_air", "hardware.precision=16-mixed"])
    assert check_device(cfg, FakeProbe(kind="mps"), said.append) == "16-mixed"
    assert len(said) == 1 and "16-mixed on MPS is opt-in" in said[0]
    said.clear()
    assert check_device(compose_train(["hardware=m2_air"]), FakeProbe(kind="mps"), said.append) == (
        "32-true"
    )
    assert said == []


def test_train_py_refuses_16_mixed_on_cpu_in_one_line_before_any_data_work(tmp_path):
    result = train_here(
        ["hardware=cpu", "preflight.enabled=false", "hardware.precision=16-mixed"], tmp_path
    )
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "hardware.precision=bf16-mixed" in errors[0]
    assert not (tmp_path / "cache").exists()  # no corpus built, no tokenizer fitted
    assert not (tmp_path / "outputs").exists()  # checked before Hydra makes the run folder


# slow (~14 s): several train.py runs, one per profile kind
@pytest.mark.slow
def test_any_profile_can_be_inspected_here_but_not_trained_on_a_device_this_machine_lacks(
    tmp_path,
):
    shown = train_here(["hardware=m2_air", "--cfg", "job"], tmp_path)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "accelerator: mps" in shown.stdout and "PYTORCH_MPS_HIGH_WATERMARK_RATIO" in shown.stdout
    refused = train_here(["hardware=m2_air"], tmp_path)
    assert refused.returncode == 2
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "set hardware=auto (or hardware=cpu)" in errors[0]
    assert not (tmp_path / "outputs").exists()


def test_a_stopped_run_that_started_fresh_names_the_command_that_resumes_it(tmp_path):
    from omegaconf import OmegaConf

    from laptrain.job.run import resume_hint

    run = tmp_path / "tiny_classifier-text_csv-2"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- resume=false\n- seed=3\n")
    fresh = OmegaConf.create({"resume": False, "ckpt_path": None})
    assert resume_hint(fresh, run) == (
        "Resume with: python train.py seed=3 run_name=tiny_classifier-text_csv-2"
    )
    assert resume_hint(OmegaConf.create({"resume": True}), run) == "Resume with the same command"


@pytest.mark.parametrize(
    ("kind", "precision", "trainer", "fused", "why"),
    [
        ("mps", "16-mixed", [], False, UNFUSED_ON_MPS_FP16),  # docs/hardware.md §3
        ("cuda", "16-mixed", [], True, None),
        ("mps", "bf16-mixed", [], True, None),  # no grad scaler
        ("mps", "32-true", [], True, None),
        # FSDP: Lightning skips unscale_ for a fused optimizer, so found_inf is never all-reduced
        ("cuda", "16-mixed", ["trainer=fsdp"], False, UNFUSED_UNDER_FSDP_FP16),
        (
            "cuda",
            "16-mixed",
            ["trainer=fsdp", f"trainer.strategy._target_={SHARDED}"],
            False,
            UNFUSED_UNDER_FSDP_FP16,
        ),
        ("cuda", "bf16-mixed", ["trainer=fsdp"], True, None),  # no scaler under bf16
        ("cuda", "16-mixed", ["trainer=ddp"], True, None),  # DDP's GradScaler sees whole gradients
    ],
)
def test_fused_adamw_is_off_for_16_mixed_on_mps_and_under_fsdp(
    tmp_path, monkeypatch, caplog, kind, precision, trainer, fused, why
):
    """The classifier's AdamW (conf/model/tiny_classifier.yaml: fused: true) as run.build makes it,
    with the device and precision checks standing in for a Mac (or GPUs) here."""
    monkeypatch.setattr(device, "check_device", lambda cfg, say: precision)
    monkeypatch.setattr(device, "plan_device", lambda cfg: kind)
    data = write_texts(tmp_path / "texts.csv", rows=60)
    overrides = ["hardware=cpu", "preflight.enabled=false", "data=text_csv", *TINY, *trainer]
    cfg = compose_train([*overrides, f"data.files.train={data}"], tmp_path)
    with caplog.at_level("INFO"):
        model = run.build(cfg, None, tmp_path)[1]
    optimizer = model.optimizer_factory(list(model.parameters()))
    assert optimizer.defaults["fused"] is fused
    said = [r.getMessage() for r in caplog.records if "fused" in r.getMessage()]
    assert said == ([why] if why else [])


@pytest.mark.parametrize(("kind", "local_rank", "index"), [("cuda", "1", 1), ("cpu", "1", None)])
def test_a_rank_reads_the_memory_of_its_own_gpu(tmp_path, monkeypatch, kind, local_rank, index):
    """torchrun and srun start every rank at once, and each sizes its base from the budget it
    reads: rank 1 reads GPU 1, not GPU 0 (cuda:LOCAL_RANK is the device it trains on)."""
    asked = []

    class Probe(run.TorchProbe):  # records what it is asked for, reads this CPU machine
        def __init__(self, probe_kind: str, probe_index: int | None = None) -> None:
            asked.append((probe_kind, probe_index))
            super().__init__("cpu")

    monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.setattr(device, "check_device", lambda cfg, say: "32-true")
    monkeypatch.setattr(device, "plan_device", lambda cfg: kind)
    monkeypatch.setattr(run, "TorchProbe", Probe)
    data = write_texts(tmp_path / "texts.csv", rows=60)
    overrides = ["hardware=cpu", "preflight.enabled=false", "data=text_csv", *TINY]
    cfg = compose_train([*overrides, f"data.files.train={data}"], tmp_path)
    run.build(cfg, None, tmp_path)
    assert asked[0] == (kind, index)
