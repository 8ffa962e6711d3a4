"""How many processes a run's config starts, and who starts them. Lightning's launcher re-runs the
command line for ranks 1..N-1 (fabric/strategies/launchers/subprocess_script.py), so under ``-m``
each rank would re-run the whole sweep (hydra#2070)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from laptrain.config.check import ConfigError
from laptrain.config.overrides import override_indices
from laptrain.hardware.probe import DEVICE_KINDS
from laptrain.ranks.environment import local_rank

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
    """Whether the strategy splits weights, gradients and optimizer state across ranks (FSDP): by
    registry name or a ``_target_`` subclassing Lightning's ``FSDPStrategy``."""
    if isinstance(strategy, str):
        return strategy.lower().startswith("fsdp")
    if not isinstance(strategy, Mapping) or "_target_" not in strategy:
        return False
    target = str(strategy["_target_"])
    if target.rsplit(".", 1)[-1] == "FSDPStrategy":
        return True
    from hydra.utils import get_class
    from lightning.pytorch.strategies import FSDPStrategy

    try:
        found = get_class(target)
    except Exception:  # Hydra names the bad target itself when the Trainer is instantiated
        return False
    return isinstance(found, type) and issubclass(found, FSDPStrategy)


def wraps_the_module(strategy: Any) -> bool:
    """Whether ``strategy`` runs ``training_step`` inside a wrapper's forward (every
    ``ParallelStrategy``, one process too), where a backward cannot run before the forward
    returns."""
    from lightning.pytorch.strategies import ParallelStrategy

    return isinstance(strategy, ParallelStrategy)


def asked_devices(cfg: Mapping[str, Any]) -> Any:
    """The ``devices`` value the Trainer is given: ``trainer.devices``, else the profile's, else 1.
    An OmegaConf list comes back as a plain list."""
    trainer, hardware = cfg.get("trainer") or {}, cfg.get("hardware") or {}
    devices = trainer.get("devices")
    if devices is None:
        devices = hardware.get("devices") or 1
    return (
        list(devices) if isinstance(devices, Sequence) and not isinstance(devices, str) else devices
    )


def known_kind(cfg: Mapping[str, Any]) -> str | None:
    """The device kind the config names (cpu, cuda, mps), or None where Lightning picks it at run
    time."""
    trainer, hardware = cfg.get("trainer") or {}, cfg.get("hardware") or {}
    accelerator = str(trainer.get("accelerator") or hardware.get("accelerator") or "cpu")
    return accelerator if accelerator in DEVICE_KINDS else None


def _shown(devices: Any) -> str:
    """A devices value as it is typed on the command line."""
    if isinstance(devices, Sequence) and not isinstance(devices, str):
        return "[" + ",".join(str(d) for d in devices) + "]"
    return repr(devices) if isinstance(devices, str) else str(devices)


def _refused(devices: Any, why: str = "is not a value Lightning takes") -> ConfigError:
    return ConfigError(
        f"trainer.devices={_shown(devices)} {why}: set a count (trainer.devices=2), a GPU list "
        "(trainer.devices=[0,1]), or auto / -1 for every GPU"
    )


def _index_list(devices: Any, items: Sequence[Any]) -> list[int]:
    """GPU indices as ``_parse_gpu_ids`` takes them: ints >= 0, at least one, none repeated."""
    if not items or any(type(i) is not int or i < 0 for i in items):
        raise _refused(devices)
    if len(set(items)) != len(items):
        raise _refused(devices, "names a GPU twice")
    return list(items)


def _lightning_form(devices: Any) -> int | list[int] | str:
    """``devices`` as Lightning reads it: a count >= 1, -1, ``auto``, or a list of GPU indices (a
    comma string is one; lightning/fabric/utilities/device_parser.py:106-113)."""
    if isinstance(devices, Sequence) and not isinstance(devices, str):
        return _index_list(devices, list(devices))
    number = devices
    if isinstance(devices, str):
        if devices == "auto":
            return "auto"
        text = devices.strip()
        if "," in text:
            parts = [p.strip() for p in text.split(",") if p]
            if not all(p.isdigit() for p in parts):
                raise _refused(devices)
            return _index_list(devices, [int(p) for p in parts])
        if not re.fullmatch(r"-?\d+", text):
            raise _refused(devices)
        number = int(text)
    if type(number) is not int or (number < 1 and number != -1):
        raise _refused(devices)
    return number


def requested_devices(devices: Any, kind: str | None) -> int | None:
    """How many devices a ``trainer.devices`` value gives the Trainer on ``kind`` (None: not known
    before torch), or None for "every CUDA device found" (``auto``, -1, "-1"), read as Lightning
    does (device_parser.py:142-155; ``auto_device_count()``, accelerator_connector.py:368-384; CPU
    counts, fabric/accelerators/cpu.py:80-101). What Lightning would refuse (0, [], other negatives,
    non-numbers, a repeated GPU, a GPU list or -1 on CPU) is a one-line :class:`ConfigError`."""
    asked = _lightning_form(devices)
    if kind == "cpu" and (isinstance(asked, list) or asked == -1):
        count = len(asked) if isinstance(asked, list) else "<processes>, e.g. 2"
        raise ConfigError(
            f"trainer.devices={_shown(devices)} names GPUs, but Lightning's cpu accelerator takes "
            f"a number of processes: set trainer.devices={count}"
        )
    if isinstance(asked, list):
        return len(asked)
    if asked in ("auto", -1):
        return 1 if kind in ("cpu", "mps") else None
    return int(asked)


def process_count(trainer: Mapping[str, Any], kind: str | None = None) -> int | None:
    """Processes the trainer asks for (devices x nodes), or None when it is decided at run time
    (every CUDA device found). Raises :class:`ConfigError` for a devices value Lightning refuses."""
    devices = requested_devices(trainer.get("devices"), kind)
    if devices is None:
        return None
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
    work: a ``trainer.devices`` value Lightning refuses, ``-m`` with a strategy that re-runs the
    command, or FSDP on CPU."""
    trainer = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert isinstance(trainer, dict)
    strategy = trainer.get("strategy", "auto")
    name = strategy if isinstance(strategy, str) else str(strategy.get("_target_", strategy))
    if "fsdp" in name.lower() and str(trainer.get("accelerator")) == "cpu":
        raise ConfigError(
            "trainer.strategy=fsdp runs on CUDA GPUs only (Lightning: 'requires a GPU "
            "accelerator'): use trainer=fsdp on a GPU machine, or trainer=ddp_cpu on CPU"
        )
    count = process_count({**trainer, "devices": asked_devices(cfg)}, known_kind(cfg))
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


def rank_cuda_index(devices: Any, environ: Mapping[str, str] | None = None) -> int:
    """The CUDA device this process trains on: ``parallel_devices[local_rank]`` as Lightning picks
    it (strategies/ddp.py:116-120, fsdp.py:196-200; accelerators/cuda.py:86-94): the r-th index of a
    list or comma string, else GPU r. Raises :class:`ConfigError` when a list names fewer GPUs than
    this local rank needs (Lightning would raise IndexError once the Trainer starts)."""
    asked = _lightning_form(devices)
    rank = local_rank(environ)
    if not isinstance(asked, list):
        return rank
    if rank >= len(asked):
        raise ConfigError(
            f"trainer.devices={_shown(devices)} names {len(asked)} GPU(s), but this process is "
            f"local rank {rank}: name one GPU per process of this machine in trainer.devices, or "
            "start that many processes per machine (torchrun --nproc_per_node, srun --ntasks-per-node)"
        )
    return asked[rank]
