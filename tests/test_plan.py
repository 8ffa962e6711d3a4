"""The run plan: decided once from profile, data, trainer and preflight; the config is not touched."""

from __future__ import annotations

import types

import pytest

from laptrain.config.check import ConfigError
from laptrain.job.plan import build_run_plan
from laptrain.launch.device import RunDevice
from tests.conftest import TINY, compose_train, write_texts
from tests.fakes import FakeProbe
from tests.in_process import train_here


def launched(cfg, index=None):
    """The launch's RunDevice for ``cfg`` at 32-true, on a machine that has the asked device."""
    accelerator = str(cfg.trainer.get("accelerator") or cfg.hardware.accelerator)
    return RunDevice(accelerator if accelerator in ("cuda", "mps") else "cpu", "32-true", index, ())


def fake_preflight(micro: int, accumulation: int, checkpointing: bool = False):
    calls = []

    def preflight(model, datamodule, request, device, *dirs):
        calls.append((request.requested, request.accumulation, request.effective_batch))
        preflight.seen_kind = device.kind
        preflight.checkpointing_asked = request.auto_checkpointing
        return types.SimpleNamespace(
            micro_batch=micro,
            accumulation=accumulation,
            checkpointing=checkpointing,
            effective_target=request.effective_batch,
            estimate=types.SimpleNamespace(total=2 * 1024**3),
            budget=types.SimpleNamespace(bytes=8 * 1024**3, source="test budget"),
            summary_lines=lambda batch=True: (
                ["preflight: estimate 2.00 GiB"] + (["preflight: effective batch"] if batch else [])
            ),
        )

    preflight.calls = calls
    return preflight


DATA = types.SimpleNamespace(num_workers=0, persistent_workers=False, pin_memory=False)


def test_an_auto_batch_comes_from_the_preflight_and_the_config_is_left_as_written(tmp_path):
    cfg = compose_train(["hardware=m2_air", "preflight.effective_batch_size=64"], tmp_path)
    preflight = fake_preflight(micro=16, accumulation=4)
    plan = build_run_plan(cfg, object(), DATA, launched(cfg), preflight=preflight)
    assert preflight.calls == [("auto", 1, 64)]
    assert (plan.loader_batch, plan.micro_batch, plan.accumulation) == (16, 16, 4)
    assert plan.effective_batch == 64 and plan.eval_batch == 16
    assert plan.trainer_kwargs()["accumulate_grad_batches"] == 4
    assert "largest that fits" in plan.reasons["batch"]
    assert "effective_batch_size=64" in plan.reasons["accumulation"]
    assert cfg.hardware.batch_size == "auto" and cfg.trainer.accumulate_grad_batches == 1
    # the preflight's own lines carry the estimate; the batch is printed once, by the plan
    assert plan.memory["lines"] == ["preflight: estimate 2.00 GiB"]
    assert not any(line.startswith("memory:") for line in plan.summary_lines())
    assert sum("effective batch" in line for line in plan.summary_lines()) == 1


def test_auto_without_the_preflight_is_refused_naming_both_options(tmp_path):
    cfg = compose_train(["hardware=m2_air", "preflight.enabled=false"], tmp_path)
    with pytest.raises(ValueError, match="preflight.enabled=true.*hardware.batch_size=<n>"):
        build_run_plan(cfg, object(), DATA, launched(cfg))


def test_a_fixed_profile_batch_is_checked_by_the_preflight_and_kept(tmp_path):
    cfg = compose_train(["hardware=cpu", "hardware.batch_size=8"], tmp_path)
    preflight = fake_preflight(micro=8, accumulation=1)
    plan = build_run_plan(cfg, object(), DATA, launched(cfg), preflight=preflight)
    assert preflight.calls == [(8, 1, None)]
    assert plan.loader_batch == 8 and plan.batch_from_profile


def test_trm_prints_the_chunk_it_really_runs_not_the_carry_size(tmp_path):
    cfg = compose_train(
        ["hardware=macbook_cpu_32gb", "model=trm_sudoku", "data=sudoku", "preflight.enabled=false"],
        tmp_path,
    )
    data = types.SimpleNamespace(batch_size=64, eval_batch_size=250, **vars(DATA))
    model = types.SimpleNamespace(micro_batch_size=16)
    plan = build_run_plan(cfg, model, data, launched(cfg))
    assert not plan.batch_from_profile  # the profile's batch_size auto does not touch TRM
    assert (plan.loader_batch, plan.micro_batch, plan.eval_batch) == (64, 16, 250)
    assert plan.effective_batch == 64
    line = next(x for x in plan.summary_lines() if x.startswith("micro batch size"))
    assert line.startswith("micro batch size: 16 (chunks of the 64-sample batch)")


def test_ddp_devices_come_from_the_trainer_config(tmp_path):
    cfg = compose_train(["hardware=cpu", "trainer=ddp_cpu", "preflight.enabled=false"], tmp_path)
    plan = build_run_plan(cfg, object(), DATA, launched(cfg))
    assert plan.devices == 2 and plan.effective_batch == 2 * plan.loader_batch
    assert plan.trainer_kwargs()["devices"] == 2


def test_auto_checkpointing_is_decided_by_the_preflight_and_recorded_in_the_plan(tmp_path):
    cfg = compose_train(["hardware=cpu", "model.gradient_checkpointing=auto"], tmp_path)
    preflight = fake_preflight(micro=16, accumulation=1, checkpointing=True)
    plan = build_run_plan(cfg, object(), DATA, launched(cfg), preflight=preflight)
    assert preflight.checkpointing_asked is True and plan.gradient_checkpointing is True
    fixed = compose_train(["hardware=cpu", "model.gradient_checkpointing=false"], tmp_path)
    preflight = fake_preflight(micro=16, accumulation=1)
    plan = build_run_plan(fixed, object(), DATA, launched(fixed), preflight=preflight)
    assert preflight.checkpointing_asked is False and plan.gradient_checkpointing is None


def test_auto_checkpointing_with_the_preflight_off_is_off_and_says_how_to_force_it(tmp_path):
    overrides = ["hardware=cpu", "preflight.enabled=false", "model.gradient_checkpointing=auto"]
    cfg = compose_train(overrides, tmp_path)
    plan = build_run_plan(cfg, object(), DATA, launched(cfg))
    assert plan.gradient_checkpointing is False
    line = next(x for x in plan.summary_lines() if x.startswith("gradient checkpointing"))
    assert line == (
        "gradient checkpointing: off (model.gradient_checkpointing=auto with the preflight off: "
        "set it to true to force it)"
    )


# slow (~15 s): two train.py runs; the plan unit tests above cover the precision choice
@pytest.mark.slow
def test_trainer_precision_on_the_command_line_is_what_the_preflight_sizes(tmp_path):
    """The Trainer reads ``trainer.precision``; the preflight's estimate follows the same value
    (it used to read ``hardware.precision`` only), through ``python train.py``."""
    data = write_texts(tmp_path / "texts.csv")
    lines = {}
    for precision in ("32-true", "bf16-mixed"):
        args = ["hardware=cpu", "data=text_csv", f"data.files.train={data}", *TINY]
        args += [f"trainer.precision={precision}", "trainer.max_steps=1", "test=false"]
        done = train_here([*args, f"run_name={precision}"], tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        out = done.stdout + done.stderr
        budget = next(line for line in out.splitlines() if "preflight: budget" in line)
        estimate = next(line for line in out.splitlines() if "preflight: estimate" in line)
        assert f"precision {precision}" in budget
        lines[precision] = estimate
    assert lines["32-true"] != lines["bf16-mixed"]


def test_a_trainer_accelerator_of_auto_reaches_the_preflight_as_the_device_kind(tmp_path):
    """Lightning takes ``auto``/``gpu``; the preflight probes a kind (cpu, cuda, mps)."""
    seen = {}
    preflight = fake_preflight(micro=8, accumulation=1)

    def spy(model, datamodule, request, device, *dirs):
        seen.update(kind=device.kind, shards=request.shards, devices=request.devices)
        return preflight(model, datamodule, request, device, *dirs)

    cfg = compose_train(["hardware=cpu", "hardware.batch_size=8", "trainer.accelerator=auto"])
    plan = build_run_plan(cfg, object(), DATA, launched(cfg), preflight=spy)
    assert seen["kind"] == "cpu" and plan.device == "cpu"
    assert plan.trainer_kwargs()["accelerator"] == "auto"  # the Trainer still gets what was asked


@pytest.mark.parametrize(
    ("overrides", "count", "given"),
    [
        (["hardware=cpu", "trainer.devices=2"], 2, 2),
        (["hardware=cpu", "trainer.devices='2'"], 2, "2"),
        (["hardware=cpu", "trainer.devices=auto"], 1, "auto"),  # CPU's auto_device_count is 1
        (["hardware=cuda", "trainer.devices=[0,1]"], 2, [0, 1]),
        (["hardware=cuda", "trainer.devices='0,1'"], 2, "0,1"),
        (["hardware=cuda", "trainer.devices=-1"], 4, -1),  # every visible GPU
        (["hardware=cuda", "trainer.devices='-1'"], 4, "-1"),
        (["hardware=cuda", "trainer.devices=auto"], 4, "auto"),
        (["hardware=mps", "trainer.devices=auto"], 1, "auto"),
    ],
)
def test_every_devices_form_lightning_takes_counts_in_the_effective_batch(
    overrides, count, given, tmp_path, monkeypatch
):
    """The Trainer gets trainer.devices as written; the summary and the effective batch count the
    devices it names (a list or "0,1" used to train on one device, -1 gave a negative batch)."""
    monkeypatch.setattr("laptrain.launch.device.visible_cuda_devices", lambda: 4)
    fixed = ["hardware.batch_size=4", "preflight.enabled=false"]
    cfg = compose_train([*overrides, *fixed], tmp_path)
    plan = build_run_plan(cfg, object(), DATA, launched(cfg))
    assert plan.devices == count and plan.effective_batch == 4 * count
    assert plan.trainer_kwargs()["devices"] == given
    assert f"({count} device(s))" in next(x for x in plan.summary_lines() if x.startswith("device"))


def test_fsdp_shards_the_estimate_over_the_gpus_a_list_names(tmp_path):
    seen = {}
    preflight = fake_preflight(micro=8, accumulation=1)

    def spy(model, datamodule, request, device, *dirs):
        seen.update(kind=device.kind, shards=request.shards, devices=request.devices)
        return preflight(model, datamodule, request, device, *dirs)

    overrides = [
        "hardware=cuda",
        "hardware.batch_size=8",
        "trainer=fsdp",
        "trainer.devices=[0,1,2]",
    ]
    cfg = compose_train(overrides, tmp_path)
    plan = build_run_plan(cfg, object(), DATA, launched(cfg), preflight=spy)
    assert seen["shards"] == 3 and seen["devices"] == 3 and plan.effective_batch == 24


@pytest.mark.parametrize(
    ("target", "shards"),
    [
        ("tests.sharded_on_cpu.ShardedOnCPU", 2),  # a subclass of Lightning's FSDPStrategy
        ("lightning.pytorch.strategies.DDPStrategy", None),
    ],
)
def test_a_strategy_class_that_subclasses_fsdp_shards_the_estimate(target, shards, tmp_path):
    seen = {}
    preflight = fake_preflight(micro=8, accumulation=1)

    def spy(model, datamodule, request, device, *dirs):
        seen.update(kind=device.kind, shards=request.shards, devices=request.devices)
        return preflight(model, datamodule, request, device, *dirs)

    overrides = ["hardware=cpu", "hardware.batch_size=8", "trainer=fsdp", "trainer.accelerator=cpu"]
    cfg = compose_train([*overrides, f"trainer.strategy._target_={target}"], tmp_path)
    build_run_plan(cfg, object(), DATA, launched(cfg), preflight=spy)
    assert seen["shards"] == (shards or 1)


@pytest.mark.parametrize(
    ("overrides", "fix"),
    [
        (["hardware=cpu", "trainer.devices=0"], "trainer.devices=0 is not a value"),
        (["hardware=cuda", "trainer.devices=-2"], "trainer.devices=-2 is not a value"),
        (["hardware=cuda", "trainer.devices=abc"], "trainer.devices='abc' is not a value"),
        (["hardware=cuda", "trainer.devices=[]"], r"trainer.devices=\[\] is not a value"),
        (["hardware=cuda", "trainer.devices=[1,1]"], r"trainer.devices=\[1,1\] names a GPU twice"),
        (["hardware=cpu", "trainer.devices=[0,1]"], "cpu accelerator .* set trainer.devices=2"),
        (["hardware=cpu", "trainer.devices=-1"], "cpu accelerator .* set trainer.devices="),
    ],
)
def test_a_devices_value_lightning_refuses_is_one_line_naming_trainer_devices(
    overrides, fix, tmp_path
):
    cfg = compose_train([*overrides, "hardware.batch_size=4", "preflight.enabled=false"], tmp_path)
    with pytest.raises(ConfigError, match=fix) as refused:
        build_run_plan(cfg, object(), DATA, launched(cfg))
    assert "\n" not in str(refused.value)


def test_a_gpu_list_on_an_auto_accelerator_that_resolves_to_cpu_is_refused_before_data_work():
    """The launch cannot tell cpu from ``auto`` before torch; the device check after it can."""
    from laptrain.launch.device import check_device

    cfg = compose_train(["hardware=cpu", "trainer.accelerator=auto", "trainer.devices=[0,1]"])
    with pytest.raises(ConfigError, match="cpu accelerator .* set trainer.devices=2"):
        check_device(cfg, FakeProbe(kind="cpu"))


def test_every_gpu_on_a_machine_without_one_is_refused_naming_trainer_devices():
    from laptrain.launch.device import device_count

    assert device_count("auto", "cuda", lambda: 3) == device_count("-1", "cuda", lambda: 3) == 3
    with pytest.raises(ConfigError, match="trainer.devices=-1 asks for every CUDA GPU"):
        device_count(-1, "cuda", lambda: 0)


def test_the_plan_trains_on_the_device_kind_the_launch_decided(monkeypatch):
    """The launch's RunDevice.kind is passed down: the plan does not probe the accelerator again."""
    from laptrain.launch import device

    def probed_again(accelerator):
        raise AssertionError(f"device kind of {accelerator} derived again")

    monkeypatch.setattr(device, "device_kind", probed_again)
    cfg = compose_train(["hardware=cpu", "hardware.batch_size=8", "trainer.accelerator=auto"])
    preflight = fake_preflight(micro=8, accumulation=1)
    plan = build_run_plan(cfg, object(), DATA, launched(cfg), preflight=preflight)
    assert plan.device == "cpu" and preflight.seen_kind == "cpu"
