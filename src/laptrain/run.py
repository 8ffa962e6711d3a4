"""One training run, in the order a reader expects: seed, build, summarise, fit, test, export.

Only this module sees the Hydra config; everything it builds takes plain arguments.
"""

from __future__ import annotations

import json
import logging
import platform
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_info
from omegaconf import DictConfig, OmegaConf

from laptrain.callbacks.graceful_stop import GracefulStop
from laptrain.config_tree import print_config
from laptrain.hardware.env import EnvReport
from laptrain.hardware.probe import DEVICE_KINDS, DeviceProbe, TorchProbe
from laptrain.hardware.profile import ProfileError, precision_warning, validate_precision
from laptrain.preflight.batch import preflight_for_run


def _instantiate_all(section: DictConfig | None) -> list[Any]:
    """Every entry with a ``_target_`` (LHT style): adding a callback or logger is adding YAML."""
    if not section:
        return []
    return [
        instantiate(c, _convert_="all")
        for c in section.values()
        if isinstance(c, DictConfig) and "_target_" in c
    ]


def resume_checkpoint(cfg: DictConfig) -> str | None:
    """The checkpoint to resume from: ``ckpt_path``, else the run's ``last.ckpt`` when resuming."""
    if cfg.get("ckpt_path"):
        path = Path(str(cfg.ckpt_path)).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"ckpt_path not found: {path} (point ckpt_path= at a .ckpt file, e.g. outputs/<run>/checkpoints/last.ckpt)"
            )
        return str(path)
    if not cfg.resume:
        return None
    last = Path(cfg.paths.ckpt_dir) / "last.ckpt"
    return str(last) if last.is_file() else None


def checkpoint_step(path: str) -> tuple[int, int]:
    """(global step, epoch) stored in a Lightning checkpoint, read without loading the tensors."""
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return int(state.get("global_step", 0)), int(state.get("epoch", 0))


def summary_lines(cfg: DictConfig, trainer: pl.Trainer, env: EnvReport | None) -> list[str]:
    """What the run will do on this machine, one item per line (seed 001; nanoGPT prints the same)."""
    hw = cfg.hardware
    micro = int(cfg.data.get("batch_size") or hw.batch_size)
    accumulation = int(trainer.accumulate_grad_batches)
    lines = [
        f"hardware profile: {hw.name}",
        f"device: {trainer.strategy.root_device} ({trainer.accelerator.__class__.__name__.replace('Accelerator', '')}, {trainer.num_devices} device(s))",
        f"precision: {trainer.precision}",
        f"micro batch size: {micro}",
        f"gradient accumulation: {accumulation}",
        f"effective batch size: {micro * accumulation * trainer.world_size}",
        f"dataloader workers: {cfg.data.get('num_workers', hw.num_workers)}",
        f"pin_memory: {cfg.data.get('pin_memory', hw.pin_memory)}",
        f"torch threads: {torch.get_num_threads()}",
    ]
    return lines + (env.lines() if env else [])


def write_run_info(folder: Path, cfg: DictConfig, lines: list[str], env: EnvReport | None) -> None:
    import lightning
    import transformers

    info = {
        "hardware": OmegaConf.to_container(cfg.hardware, resolve=True),
        "summary": lines,
        "torch_threads": torch.get_num_threads(),
        "env_applied": env.applied if env else {},
        "env_kept": env.kept if env else {},
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "lightning": lightning.__version__,
            "transformers": transformers.__version__,
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run_info.json").write_text(json.dumps(info, indent=1, default=str))


def check_device(
    cfg: DictConfig, probe: DeviceProbe | None = None, say: Callable[[str], None] = rank_zero_info
) -> str:
    """The first check of every run, before any data or model work: the device the trainer is
    asked for exists here and can run the precision asked for (preflight on or off). Returns the
    precision in Lightning's spelling; a precision that runs but is unmeasured gets one warning."""
    accelerator = str(cfg.trainer.get("accelerator") or cfg.hardware.get("accelerator") or "cpu")
    if accelerator in ("gpu", "auto"):  # Lightning's own order: MPS, then CUDA, then CPU
        accelerator = next((k for k in ("mps", "cuda") if TorchProbe(k).available()), "cpu")
    kind = accelerator if accelerator in DEVICE_KINDS else "cpu"
    probe = probe or TorchProbe(kind)
    if not probe.available():
        raise ProfileError(
            f"hardware={cfg.hardware.get('name')} trains on {kind}, which this machine cannot use: "
            "set hardware=auto (or hardware=cpu)"
        )
    precision = cfg.trainer.get("precision") or cfg.hardware.get("precision") or "32-true"
    text = validate_precision(precision, kind, probe.bf16_supported())
    warning = precision_warning(text, kind)
    if warning:
        say(warning)
    return text


def _single_log_stream() -> None:
    """Lightning adds its own console handler; Hydra's already prints to the console and train.log."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


def batch_follows_profile(cfg: DictConfig) -> bool:
    """Whether ``hardware.batch_size: auto`` decides this run's batch: only for data whose batch is
    ``${hardware.batch_size}`` (TRM's batch is its number of carry slots, set by the data config)."""
    return str(cfg.hardware.get("batch_size")) == "auto" and OmegaConf.is_interpolation(
        cfg.data, "batch_size"
    )


def plan_preflight(cfg: DictConfig, model: Any, datamodule: Any, output_dir: Path) -> None:
    """Memory preflight: print the estimate, set the micro batch (auto) and the accumulation."""
    options = cfg.get("preflight") or {}
    auto = batch_follows_profile(cfg)
    profile = OmegaConf.to_container(cfg.hardware, resolve=True)
    if isinstance(cfg.trainer.get("devices"), int):  # trainer=ddp_cpu runs more than the profile's
        profile["devices"] = cfg.trainer.devices
    if not auto and str(profile.get("batch_size")) == "auto":
        profile["batch_size"] = int(getattr(datamodule, "batch_size", 1) or 1)
    if not options.get("enabled", True):
        if auto:
            raise ValueError(
                "hardware.batch_size=auto needs preflight.enabled=true (or set hardware.batch_size=<n>)"
            )
        return
    plan = preflight_for_run(
        model,
        datamodule,
        profile,
        accumulation=int(cfg.trainer.get("accumulate_grad_batches") or 1),
        effective_batch=options.get("effective_batch_size"),
        max_batch=int(options.get("max_batch_size") or 256),
        verify=bool(options.get("verify", False)),
        output_dir=output_dir,
        cache_dir=Path(cfg.paths.cache_dir),
    )
    if plan is None:
        rank_zero_info("preflight: skipped (no transformers model to measure); batch as configured")
        return
    for line in plan.summary_lines():
        rank_zero_info(line)
    if auto:
        cfg.hardware.batch_size = plan.micro_batch
    cfg.trainer.accumulate_grad_batches = plan.accumulation


def train(cfg: DictConfig, env: EnvReport | None = None) -> float | None:
    """Train (resuming when the run folder has a checkpoint), test on the best checkpoint, export."""
    if HydraConfig.initialized():
        _single_log_stream()
    output_dir = Path(cfg.paths.output_dir)
    print_config(cfg)
    if not (env and env.device_checked):  # train.py checks it before Hydra makes the run folder
        check_device(cfg)
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    if cfg.hardware.get("torch_threads"):
        torch.set_num_threads(int(cfg.hardware.torch_threads))

    # batch_size auto: a placeholder until the preflight has measured the model
    auto_batch = batch_follows_profile(cfg)
    datamodule = instantiate(cfg.data, _convert_="all", **({"batch_size": 1} if auto_batch else {}))
    datamodule.prepare_data()
    datamodule.setup("fit")
    model_kwargs = datamodule.model_kwargs() if hasattr(datamodule, "model_kwargs") else {}
    model = instantiate(cfg.model, _convert_="all", **model_kwargs)
    plan_preflight(cfg, model, datamodule, output_dir)

    callbacks = _instantiate_all(cfg.get("callbacks"))
    loggers = _instantiate_all(cfg.get("logger"))
    trainer: pl.Trainer = instantiate(
        cfg.trainer, callbacks=callbacks, logger=loggers or False, _convert_="all"
    )

    lines = summary_lines(cfg, trainer, env)
    for line in lines:
        rank_zero_info(line)
    if trainer.is_global_zero:
        write_run_info(output_dir, cfg, lines, env)
        if hasattr(datamodule, "save_artifacts"):
            datamodule.save_artifacts(output_dir)
    for lg in loggers:
        lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))

    ckpt_path = resume_checkpoint(cfg)
    if ckpt_path:
        step, epoch = checkpoint_step(ckpt_path)
        rank_zero_info(
            f"resuming from {ckpt_path} (global step {step}, epoch {epoch}); resume=false starts a new run"
        )
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)

    stop = next((c for c in callbacks if isinstance(c, GracefulStop)), None)
    if stop is not None and stop.signal_received is not None:
        name = signal.Signals(stop.signal_received).name
        rank_zero_info(
            f"{name}: stopped at global step {trainer.global_step}; checkpoint {stop.path}. "
            "Resume with the same command (or ckpt_path=<that file>)."
        )
        sys.exit(128 + stop.signal_received)
    # A callback that stops the run on purpose (session budget, swap) leaves it resumable: exit 0.
    paused = next((c.stop_reason for c in callbacks if getattr(c, "stop_reason", None)), None)
    if paused:
        # The stopping callback saved last.ckpt at the batch boundary (laptrain/callbacks/
        # stop_checkpoint.py); a save here, after fit, would count the interrupted epoch as done.
        last = Path(cfg.paths.ckpt_dir) / "last.ckpt"
        rank_zero_info(
            f"stopped ({paused}) at global step {trainer.global_step}; checkpoint {last}. "
            "Resume with the same command."
        )
        return None

    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    if cfg.get("test") and trainer.checkpoint_callback is not None:
        best = trainer.checkpoint_callback.best_model_path or None
        results = trainer.test(
            model, datamodule=datamodule, ckpt_path=best or None, weights_only=False
        )
        for result in results:
            metrics.update({k: float(v) for k, v in result.items()})
    if trainer.is_global_zero and hasattr(model, "export"):
        model.export(output_dir / "model")
        (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=1))
    rank_zero_info(f"run folder: {output_dir}")
    return metrics.get(str(cfg.get("optimized_metric")))
