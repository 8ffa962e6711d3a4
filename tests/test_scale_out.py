"""laptrain.ranks.processes and the scale-out presets: trainer=ddp / fsdp, launcher=slurm (composed and
instantiated here; no cluster, no GPU), and -m refused where each rank would re-run the sweep."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate

from laptrain.config.check import ConfigError, check_config, compose_argv
from laptrain.ranks.processes import asks_multirun, check_scale_out, reruns_command
from tests.conftest import CONF, TINY
from tests.in_process import train_here


def compose(overrides: list[str]):
    """The config train.py's pre-check composes for these overrides."""
    return compose_argv(["train.py", *overrides], str(CONF))


@pytest.mark.parametrize(
    ("strategy", "reruns"),
    [
        ("ddp", True),
        ("ddp_find_unused_parameters_true", True),
        ("fsdp", True),
        ("deepspeed_stage_2", True),
        ("ddp_spawn", False),
        ("ddp_fork", False),
        ("ddp_notebook", False),
        ("auto", False),
        ("single_device", False),
        ({"_target_": "lightning.pytorch.strategies.FSDPStrategy"}, True),
        ({"_target_": "lightning.pytorch.strategies.ModelParallelStrategy"}, True),
        ({"_target_": "lightning.pytorch.strategies.DDPStrategy"}, True),
        ({"_target_": "lightning.pytorch.strategies.DDPStrategy", "start_method": "spawn"}, False),
    ],
)
def test_which_strategies_start_ranks_by_rerunning_the_command(strategy, reruns):
    assert reruns_command(strategy) is reruns


def test_multirun_is_read_from_options_not_from_override_values():
    assert asks_multirun(["train.py", "-m", "a=1,2"])
    assert asks_multirun(["train.py", "a=1", "--multirun"])
    assert not asks_multirun(["train.py", "run_name=-m"])


def test_a_sweep_with_ddp_is_refused_unless_something_else_starts_the_ranks(monkeypatch):
    for name in ("SLURM_NTASKS", "SLURM_JOB_NAME", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    ddp = compose(["hardware=cpu", "trainer=ddp_cpu", "trainer.strategy=ddp"])
    with pytest.raises(ConfigError, match="trainer=ddp_cpu .*launcher=slurm"):
        check_scale_out(ddp, multirun=True)
    check_scale_out(ddp, multirun=False)  # one run: Lightning's launcher is right
    check_scale_out(compose(["hardware=cpu", "trainer=ddp_cpu"]), multirun=True)  # spawn
    one = compose(["hardware=cpu", "trainer.strategy=ddp"])  # one device, one process
    check_scale_out(one, multirun=True)
    slurm = compose(["hardware=cpu", "trainer=ddp_cpu", "trainer.strategy=ddp", "launcher=slurm"])
    check_scale_out(slurm, multirun=True)
    # already inside a SLURM allocation (srun started this process): Lightning takes the ranks
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    check_scale_out(ddp, multirun=True)


def test_fsdp_on_cpu_is_refused_naming_the_cpu_preset():
    cfg = compose(["hardware=cpu", "trainer=fsdp", "trainer.accelerator=cpu"])
    with pytest.raises(ConfigError, match="trainer=ddp_cpu"):
        check_scale_out(cfg, multirun=False)


def test_slurm_with_fsdp_composes_and_instantiates_without_a_cluster():
    cfg = compose(["hardware=cpu", "launcher=slurm", "trainer=fsdp", "trainer.devices=4"])
    check_config(cfg, {"data.batch_size": 1})  # every _target_ binds to its constructor
    check_scale_out(cfg, multirun=True)  # srun starts the ranks
    strategy = instantiate(cfg.trainer.strategy)
    assert type(strategy).__name__ == "FSDPStrategy" and strategy._state_dict_type == "full"
    assert cfg.trainer.accelerator == "cuda"
    launcher = instantiate(cfg.hydra.launcher)
    assert type(launcher).__name__ == "SlurmLauncher"
    assert launcher.params["tasks_per_node"] == launcher.params["gpus_per_node"] == 4
    assert launcher.params["nodes"] == 1 and launcher.params["timeout_min"] > 0

    ddp = compose(["hardware=cpu", "trainer=ddp"])
    assert (ddp.trainer.strategy, ddp.trainer.accelerator, ddp.trainer.devices) == (
        "ddp",
        "cuda",
        2,
    )


def test_train_py_refuses_a_ddp_sweep_in_one_line_before_making_a_folder(tmp_path, monkeypatch):
    from laptrain.launch.prepare import prepare  # train.py prints it as one `error:` line, exit 2

    monkeypatch.chdir(tmp_path)
    argv = ["train.py", "-m", "hardware=cpu", *TINY, "trainer=ddp_cpu", "trainer.strategy=ddp"]
    with pytest.raises(ConfigError) as refused:
        prepare([*argv, "seed=1,2"], Path(CONF))
    line = str(refused.value)
    assert "\n" not in line and "ddp_spawn" in line and "launcher=slurm" in line
    assert not (tmp_path / "outputs").exists()


def test_a_devices_value_lightning_refuses_stops_train_py_before_any_job_in_one_line(tmp_path):
    """``--cfg job`` runs no job: the refusal comes from the launch's checks, exit code 2."""
    for devices, fix in (("[0,1]", "set trainer.devices=2"), ("0", "trainer.devices=0 is not")):
        args = ["hardware=cpu", "trainer=ddp_cpu", f"trainer.devices={devices}", "--cfg", "job"]
        done = train_here(args, tmp_path)
        assert done.returncode == 2, done.stderr[-2000:]
        assert done.stderr.strip().splitlines() == [done.stderr.strip()]
        assert fix in done.stderr and "trainer.devices" in done.stderr


def test_a_sweep_of_one_cpu_process_per_job_is_not_refused(monkeypatch):
    """trainer.devices=auto on CPU is one process (CPU's auto_device_count is 1), so -m works."""
    for name in ("SLURM_NTASKS", "SLURM_JOB_NAME", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    for devices in ("auto", "'1'"):
        cfg = compose(["hardware=cpu", "trainer.strategy=ddp", f"trainer.devices={devices}"])
        check_scale_out(cfg, multirun=True)
    with pytest.raises(ConfigError, match="hydra#2070"):
        check_scale_out(compose(["hardware=cpu", "trainer=ddp_cpu", "trainer.strategy=ddp"]), True)
