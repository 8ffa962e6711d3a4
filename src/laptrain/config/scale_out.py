"""Checks for runs on several processes, made before Hydra starts any job.

Gap it fills: Lightning starts the ranks of ``ddp``, ``fsdp``, ``deepspeed`` and
``ModelParallelStrategy`` with its subprocess launcher, which re-runs this command line for ranks
1..N-1 with rank 0's ``hydra.run.dir`` (lightning/fabric/strategies/launchers/subprocess_script.py).
For one run that is right; under ``-m`` each of those ranks re-runs the whole sweep (hydra#2070).
Neither Lightning nor Hydra refuses the combination, so laptrain does, unless something else
starts the ranks: SLURM's srun (``launcher=slurm``) or torchrun, which Lightning's
``SLURMEnvironment`` and ``TorchElasticEnvironment`` detect.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from laptrain.config.check import ConfigError
from laptrain.config.overrides import override_indices

# Registry names (lightning.pytorch.strategies.StrategyRegistry) whose ranks the subprocess
# launcher starts; ddp_spawn/ddp_fork/ddp_notebook start theirs inside the running process.
RERUN_PREFIXES = ("ddp", "fsdp", "deepspeed", "model_parallel")
IN_PROCESS_MARKERS = ("spawn", "fork", "notebook")
RERUN_CLASSES = ("FSDPStrategy", "DeepSpeedStrategy", "ModelParallelStrategy")


def asks_multirun(argv: Sequence[str]) -> bool:
    """Whether a ``train.py`` command line asks Hydra for a sweep (``-m``/``--multirun``)."""
    overrides = set(override_indices(argv))
    return any(
        a in ("-m", "--multirun") or a.startswith("--mu")
        for i, a in enumerate(argv)
        if i and i not in overrides
    )


def reruns_command(strategy: Any) -> bool:
    """Whether Lightning starts this strategy's other ranks by re-running the command line."""
    if isinstance(strategy, str):
        name = strategy.lower()
        return name.startswith(RERUN_PREFIXES) and not any(m in name for m in IN_PROCESS_MARKERS)
    if isinstance(strategy, Mapping) and "_target_" in strategy:
        target = str(strategy["_target_"]).rsplit(".", 1)[-1]
        if target in RERUN_CLASSES:
            return True
        if target == "DDPStrategy":
            return strategy.get("start_method", "popen") == "popen"
    return False


def shards_model_state(strategy: Any) -> bool:
    """Whether the strategy splits weights, gradients and optimizer state across ranks (FSDP)."""
    if isinstance(strategy, str):
        return strategy.lower().startswith("fsdp")
    if isinstance(strategy, Mapping) and "_target_" in strategy:
        return str(strategy["_target_"]).rsplit(".", 1)[-1] == "FSDPStrategy"
    return False


def process_count(trainer: Mapping[str, Any]) -> int | None:
    """Processes the trainer asks for (devices x nodes), or None when it is decided at run time."""
    devices = trainer.get("devices")
    if isinstance(devices, list | tuple):
        devices = len(devices)
    if not isinstance(devices, int) or devices < 1:
        return None  # "auto" or -1: every device found
    return devices * int(trainer.get("num_nodes") or 1)


def ranks_started_outside(cfg: DictConfig) -> bool:
    """srun (Hydra's submitit SLURM launcher, or already inside a SLURM job) or torchrun starts
    the ranks, as Lightning's own environment detection sees this process."""
    launcher = OmegaConf.select(cfg, "hydra.launcher._target_", default="") or ""
    if str(launcher).endswith("SlurmLauncher"):
        return True
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    return SLURMEnvironment.detect() or TorchElasticEnvironment.detect()


def check_scale_out(cfg: DictConfig, multirun: bool) -> None:
    """Raise :class:`ConfigError` (one line naming the fix) for a multi-process setup that cannot
    work: ``-m`` with a strategy that re-runs the command, or FSDP on CPU."""
    trainer = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert isinstance(trainer, dict)
    strategy = trainer.get("strategy", "auto")
    name = strategy if isinstance(strategy, str) else str(strategy.get("_target_", strategy))
    if "fsdp" in name.lower() and str(trainer.get("accelerator")) == "cpu":
        raise ConfigError(
            "trainer.strategy=fsdp runs on CUDA GPUs only (Lightning: 'requires a GPU "
            "accelerator'): use trainer=fsdp on a GPU machine, or trainer=ddp_cpu on CPU"
        )
    count = process_count(trainer)
    if not multirun or not reruns_command(strategy) or count == 1:
        return
    if ranks_started_outside(cfg):
        return
    short = name.rsplit(".", 1)[-1]
    raise ConfigError(
        f"-m with trainer.strategy={short}: Lightning starts the other ranks by re-running this "
        "command, so each would re-run the whole sweep (hydra#2070); use trainer=ddp_cpu "
        "(trainer.strategy=ddp_spawn) to sweep on one machine, launcher=slurm (srun starts the "
        "ranks), or torchrun"
    )


def extra_rank() -> bool:
    """A process of a multi-process launch other than rank 0 (the ranks Lightning's subprocess
    launcher, torchrun or srun start see these variables; rank 0 speaks for all of them)."""
    return any(
        os.environ.get(key) not in (None, "", "0")
        for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "NODE_RANK")
    )
