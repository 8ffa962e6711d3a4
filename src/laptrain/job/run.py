"""One training run, in the order a reader expects: seed, build, summarise, fit, test, export. Only
this module sees the Hydra config; everything it builds takes plain arguments."""

from __future__ import annotations

import gc
import json
import logging
import math
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import lightning.pytorch as pl
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from laptrain.callbacks.acting import build_callbacks, guards_line
from laptrain.callbacks.contracts import ended_early, signal_stop, stop_reason
from laptrain.callbacks.fused_optimizer_check import FusedOptimizerCheck
from laptrain.callbacks.monitored_metric import MonitoredMetricCheck
from laptrain.callbacks.trial_pruning import TrialPruning, sweep_trial_number, trial_of
from laptrain.checkpoints.checkpoint_io import checkpoint_plugins, weights_only_under_fsdp
from laptrain.checkpoints.resume import (
    checked_resume_checkpoint,
    final_step,
    resuming_line,
    written_last,
)
from laptrain.checkpoints.stop import use_last_checkpoint, without_lightning_no_ops
from laptrain.checkpoints.trusted import TrustedGlobals, trusted_globals
from laptrain.config.batch_request import batch_request
from laptrain.config.check import LAPTRAIN_KEYS, ConfigError
from laptrain.config.secrets import masked
from laptrain.config.tree import print_config
from laptrain.console import (
    best_checkpoint,
    metric_lines,
    no_transformers_bars,
    parameter_line,
    quiet_libraries,
    relative,
)
from laptrain.data.contracts import SavesArtifacts, SizesTheModel
from laptrain.data.user_loaders import prepare_user_loaders
from laptrain.exit_codes import PAUSED_EXIT, PRUNED_EXIT
from laptrain.family import family_of
from laptrain.files import write_folder_atomic, write_text_atomic
from laptrain.hardware.env import EnvReport
from laptrain.hardware.probe import TorchProbe
from laptrain.hardware.profile import fused_optimizer_unsafe
from laptrain.job.datamodule_settings import build_datamodule, set_up
from laptrain.job.hparams import best_score, final_metrics, hp_keys, log_hparams
from laptrain.job.plan import RunPlan, build_run_plan, planned_datamodule
from laptrain.launch.device import (
    RunDevice,
    decide_device,
    device_count,
    fused_risk,
    job_device,
    without_unsafe_fused,
)
from laptrain.loggers.tracking import prepared as prepared_loggers
from laptrain.loggers.tracking import remember as remember_tracking_runs
from laptrain.loggers.tracking import runs_ended
from laptrain.model.contracts import ExportsModel
from laptrain.model.fsdp_units import fsdp_strategy_for, whole_state_dict
from laptrain.model.gradient_checkpointing import ChecksGradientCheckpointing
from laptrain.preflight.budget import capacity_budget, device_budget
from laptrain.ranks.environment import extra_rank
from laptrain.ranks.processes import asked_devices, shards_model_state
from laptrain.ranks.spawned import carry_outcomes_back
from laptrain.run_folder.listing import resume_command
from laptrain.run_folder.lock import hold_run_folder, made_here, release_run_folder
from laptrain.versions import package_versions


def _instantiate_all(section: DictConfig | None) -> list[Any]:
    """Every entry with a ``_target_`` (LHT style): adding a callback or logger is adding YAML."""
    if not section:
        return []
    return [
        instantiate(c, _convert_="all")
        for c in section.values()
        if isinstance(c, DictConfig) and "_target_" in c
    ]


def _instantiate_list(section: Any) -> list[Any]:
    """A list (or one) of ``_target_`` entries, e.g. ``trainer.plugins``; strings pass through."""
    if not section:
        return []
    items = section if OmegaConf.is_list(section) or isinstance(section, list) else [section]
    return [instantiate(i, _convert_="all") if OmegaConf.is_dict(i) else i for i in items]


def summary_lines(plan: RunPlan, env: EnvReport | None) -> list[str]:
    """What the run will do on this machine, one item per line, rendered from the plan."""
    threads = f"torch threads: {torch.get_num_threads()} (torch default)"
    lines = [
        threads if plan.threads is None and line.startswith("torch threads") else line
        for line in plan.summary_lines()
    ]
    return lines + (env.lines() if env else [])


def write_run_info(folder: Path, plan: RunPlan, lines: list[str], env: EnvReport | None) -> None:
    info = {
        "plan": plan.to_dict(),
        "summary": lines,
        "torch_threads": torch.get_num_threads(),
        "env_applied": env.applied if env else {},
        "env_kept": env.kept if env else {},
        "versions": package_versions(),
    }
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / "run_info.json", json.dumps(info, indent=1, default=str))


def _single_log_stream() -> None:
    """Lightning adds its own console handler; Hydra's already prints to the console and train.log."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


@dataclass(frozen=True)
class Outcome:
    """How a run ended: ``exit_code`` for the shell (0: done; ``PAUSED_EXIT``: paused on purpose;
    128 + signal number after Ctrl-C/SIGTERM) and the metric a sweeper optimises (None unless
    done)."""

    status: str  # "done", "paused" (session budget, swap), "interrupted" or "pruned"
    exit_code: int = 0
    metric: float | None = None


class Built(NamedTuple):
    """What :func:`build` makes: the datamodule (with the plan's batch sizes), the model, the run
    plan, and ``remake``, which builds the same model again, untrained."""

    datamodule: Any
    model: Any
    plan: RunPlan
    remake: Callable[[], Any]


def build(cfg: DictConfig, device: RunDevice | None, output_dir: Path) -> Built:
    """Data, model and the run plan, in that order, on ``device`` (the launch's decision; None:
    decided here); the datamodule that trains has the plan's batch sizes and, when it is not
    laptrain's, the profile's loader settings it has as attributes or hparams."""
    device = device or decide_device(cfg)
    kind, precision, index = device.kind, device.precision, device.index
    pin_rank_gpu(index)
    batch = batch_request(cfg)  # parsed once: the datamodule and the plan are given it
    datamodule = build_datamodule(cfg.data, batch.follows_profile)
    datamodule.prepare_data()
    processes = device_count(asked_devices(cfg), kind) * int(cfg.trainer.get("num_nodes") or 1)
    set_up(datamodule, processes, batch.follows_profile)
    model_kwargs = datamodule.model_kwargs() if isinstance(datamodule, SizesTheModel) else {}
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    for key in LAPTRAIN_KEYS:  # read by the launcher, not arguments of the module
        model_cfg.pop(key, None)
    sharded = shards_model_state(cfg.trainer.get("strategy"))
    model_cfg = without_unsafe_fused(model_cfg, kind, precision, sharded=sharded)
    # a rank reads its own GPU (torchrun and srun start ranks that each size their base here)
    probe = TorchProbe(kind, index)
    hw = cfg.hardware
    fraction, budget_gb = float(hw.get("memory_fraction", 0.8)), hw.get("memory_budget_gb")
    family = family_of(model_cfg)
    auto = family.auto_settings if family is not None else None
    decided: dict[str, Any] = {}
    if auto is not None:  # the family's auto settings (LoRA: base_dtype=auto, fp32 if it fits)
        decided = auto(
            model_cfg,
            lambda: device_budget(probe, fraction, budget_gb).bytes,
            probe.bf16_supported(),
            rank_zero_info,
            capacity_bytes=lambda: capacity_budget(probe, fraction, budget_gb),
        )
    remake = partial(instantiate, model_cfg, _convert_="all", **model_kwargs, **decided)
    model = remake()
    plan = build_run_plan(
        cfg, model, datamodule, device, output_dir, Path(cfg.paths.cache_dir), batch=batch
    )
    if plan.gradient_checkpointing and isinstance(model, ChecksGradientCheckpointing):
        model.use_gradient_checkpointing()  # model.gradient_checkpointing=auto: the job needs it
    return Built(planned_datamodule(plan, model, datamodule), model, plan, remake)


def pin_rank_gpu(index: int | None) -> None:
    """Make this rank's GPU (``trainer.devices[local rank]``) the current CUDA device before
    anything touches CUDA, as Lightning does only once the Trainer starts
    (``CUDAAccelerator.setup_device``, lightning/pytorch/accelerators/cuda.py:38-47): until then
    ``mem_get_info()``, ``"cuda"`` and a 4-bit base's ``device_map`` mean GPU 0, which another job
    may own."""
    if index is not None and torch.cuda.is_available():
        torch.cuda.set_device(index)


def train(
    cfg: DictConfig, env: EnvReport | None = None, device: RunDevice | None = None
) -> Outcome:
    """Train (resuming when the run folder has a checkpoint), test on the best checkpoint, export;
    the run folder is locked against a second process for the time of the run. ``env`` and
    ``device`` are what the launch exported and decided (laptrain.launch.prepare.Launch)."""
    output_dir = Path(cfg.paths.output_dir)
    taken = hold_run_folder(output_dir)
    try:
        with runs_ended():  # a W&B run ends with its job (a sweep's next job starts its own)
            return _train(cfg, env, device, output_dir)
    finally:
        if taken:
            release_run_folder(output_dir)


def _train(
    cfg: DictConfig, env: EnvReport | None, launched: RunDevice | None, output_dir: Path
) -> Outcome:
    _set_up_process(cfg)
    datamodule, model, plan, remake = build(cfg, job_device(cfg, launched), output_dir)
    # what the config builds may be in the checkpoints (a network, partial optimizers): allowed
    sections = [OmegaConf.to_container(cfg[name], resolve=True) for name in ("model", "data")]
    trusted = trusted_globals(sections, model, datamodule)
    trainer, callbacks, loggers, guards = _make_trainer(cfg, plan, model, datamodule, trusted)
    _announce(cfg, env, output_dir, trainer, loggers, datamodule, model, plan, guards)
    ckpt_path = checked_resume_checkpoint(
        cfg.get("ckpt_path"), cfg.resume, cfg.paths.ckpt_dir, cfg.paths.last_ckpt, model, trusted
    )
    if ckpt_path:
        rank_zero_info(resuming_line(ckpt_path, trusted))
    try:
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    except SystemExit as stop:
        return _interrupted(stop, "fit", cfg, output_dir, trainer)
    except ConfigError:  # bad input found by running it (e.g. an unlogged monitored metric)
        if ckpt_path is None and trainer.is_global_zero and made_here(output_dir):
            shutil.rmtree(output_dir, ignore_errors=True)  # a first run: nothing of it is kept
        raise
    step = final_step(trainer.global_step, cfg.paths.last_ckpt, trusted)
    stopped = _stopped(cfg, output_dir, step, callbacks)
    if stopped is not None:
        return stopped
    best = _best(trainer, callbacks, trusted)  # before test: it restores older callback states
    try:
        metrics, model = _test(cfg, trainer, model, datamodule, remake)
    except SystemExit as stop:
        return _interrupted(stop, "test", cfg, output_dir, trainer)
    # laptrain.job.hparams: best validation (what sweepers get), HPARAMS row; issue 14
    metrics = final_metrics(callbacks, metrics, str(cfg.optimized_metric), output_dir, trusted)
    log_hparams(loggers, cfg, model, plan, metrics, step)
    # under FSDP the weights are gathered from every rank's shards (a collective), else None
    state = whole_state_dict(trainer) if isinstance(model, ExportsModel) else None
    if trainer.is_global_zero:
        if isinstance(model, ExportsModel):
            export = partial(model.export, state_dict=state)
            with no_transformers_bars():  # written beside its place, then swapped in
                write_folder_atomic(output_dir / model.export_folder, export)
        # every family, TRM too (it exports nothing: its metrics.json was never written)
        write_text_atomic(output_dir / "metrics.json", json.dumps(metrics, indent=1))
    for line in closing_lines(step, metrics, best, output_dir, ended_early(callbacks)):
        rank_zero_info(line)
    return Outcome("done", 0, metrics.get(hp_keys(str(cfg.optimized_metric))[0]))


def _set_up_process(cfg: DictConfig) -> None:
    """One console stream, quiet libraries, the config tree if asked, seeds and threads; what the
    imports built is frozen out of the garbage collector's reach, so that each ``gc.collect()``
    before a memory measurement or an OOM retry walks only the run's objects (0.23 s a call on 2
    cores with torch, Lightning and transformers imported; an auto batch makes about 24)."""
    gc.collect()
    gc.freeze()
    if HydraConfig.initialized():
        _single_log_stream()
    quiet_libraries()
    if cfg.get("print_config"):
        rank_zero_only(print_config)(cfg)  # ranks started by re-running train.py print nothing
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    if cfg.hardware.get("torch_threads"):
        torch.set_num_threads(int(cfg.hardware.torch_threads))


def _make_trainer(
    cfg: DictConfig, plan: RunPlan, model: Any, datamodule: Any, trusted: TrustedGlobals
) -> tuple[pl.Trainer, list[Any], list[Any], str]:
    """The Trainer of the config with the plan's arguments, the callbacks that can act on
    ``model``'s run, its loggers and the console line naming the guards built; a user's datamodule
    gets Lightning's distributed sampler and a resumable train loader."""
    built = build_callbacks(cfg.get("callbacks"), model)
    # MLflow / W&B: the run folder's tracking runs continued, W&B offline without a key
    folder = Path(cfg.paths.output_dir)
    section = prepared_loggers(cfg.get("logger"), folder, tracked=not extra_rank())
    loggers = _instantiate_all(section)
    if not loggers:  # LearningRateMonitor raises without a logger (logger=none)
        built = {k: cb for k, cb in built.items() if not isinstance(cb, LearningRateMonitor)}
    # the metric check first: before Lightning's EarlyStopping raises its own error for an unlogged
    # metric
    callbacks = [
        MonitoredMetricCheck(_model_preset(), "_metric_" in cfg.model),
        *built.values(),
        *_trial_pruning(str(cfg.optimized_metric)),
    ]
    sharded = shards_model_state(cfg.trainer.get("strategy"))
    if fused_optimizer_unsafe(plan.device, plan.precision, sharded):  # the module's own optimizer
        callbacks.append(FusedOptimizerCheck(fused_risk(plan.device)))
    sampler = prepare_user_loaders(datamodule, cfg.trainer.get("use_distributed_sampler"))
    trainer = instantiate_trainer(
        cfg, plan, model, callbacks, loggers, trusted, use_distributed_sampler=sampler
    )
    if trainer.is_global_zero:
        remember_tracking_runs(section, loggers, folder)
    return trainer, callbacks, loggers, guards_line(built)


def _trial_pruning(monitor: str) -> list[TrialPruning]:
    """The pruning callback of the Optuna trial a laptrain sweep started this job for (its number
    in the job's environment, the study's storage, name and pruner in ``hydra.sweeper``)."""
    number = sweep_trial_number()
    if number is None or not HydraConfig.initialized():
        return []
    sweeper = HydraConfig.get().sweeper
    trial = trial_of(str(sweeper.storage), str(sweeper.study_name), number, sweeper.get("pruner"))
    return [TrialPruning(trial, monitor)]


def _model_preset() -> str:
    """The ``model=<preset>`` this run composed (its YAML is named in a fix), or ``<preset>``."""
    if not HydraConfig.initialized():
        return "<preset>"
    return str(HydraConfig.get().runtime.choices.get("model") or "<preset>")


def instantiate_trainer(
    cfg: DictConfig,
    plan: RunPlan,
    model: Any,
    callbacks: list[Any],
    loggers: list[Any],
    trusted: TrustedGlobals | None = None,
    **overrides: Any,
) -> pl.Trainer:
    """``cfg.trainer`` with the plan's arguments, these callbacks and loggers, and the checkpoint
    plugins (``trusted``'s objects allowed); keyword arguments win (``laptrain bench``'s). Stops and
    saves write ``paths.last_ckpt``; under ``trainer=fsdp`` the strategy gets ``model``'s units
    (laptrain.model.fsdp_units) and loads full checkpoints ``weights_only``."""
    trainer = instantiate(
        cfg.trainer,
        **plan.trainer_kwargs(),
        callbacks=callbacks,
        logger=loggers or False,
        plugins=checkpoint_plugins(_instantiate_list(cfg.trainer.get("plugins")), trusted),
        _convert_="all",
        **overrides,
    )
    use_last_checkpoint(trainer, cfg.paths.last_ckpt)
    fsdp_strategy_for(model, trainer.strategy)
    carry_outcomes_back(trainer.strategy)  # ddp_spawn: a pause or a signal's stop, as in 1 process
    weights_only_under_fsdp(trainer.strategy)  # full checkpoints too: Lightning's own load is not
    without_lightning_no_ops(trainer.callbacks)
    return trainer


def _announce(
    cfg: DictConfig,
    env: EnvReport | None,
    output_dir: Path,
    trainer: pl.Trainer,
    loggers: list[Any],
    datamodule: Any,
    model: Any,
    plan: RunPlan,
    guards: str,
) -> None:
    """The summary on console, run_info and loggers; the data's artifacts in the run folder."""
    lines = [parameter_line(model), *summary_lines(plan, env), guards]
    for line in [*(plan.memory or {}).get("lines", []), *lines]:
        rank_zero_info(line)
    if trainer.is_global_zero:
        write_run_info(output_dir, plan, lines, env)
        if isinstance(datamodule, SavesArtifacts):
            datamodule.save_artifacts(output_dir)
    config = masked({**OmegaConf.to_container(cfg, resolve=True), "plan": plan.trainer_kwargs()})
    for lg in loggers:
        lg.log_hyperparams(config)


def _stopped(cfg: DictConfig, output_dir: Path, step: int, callbacks: list[Any]) -> Outcome | None:
    """How a fit that ended early at global ``step`` ended (a signal, a callback pausing it), or
    None."""
    last = Path(cfg.paths.last_ckpt)
    signum = signal_stop(callbacks)
    if signum is not None:
        rank_zero_info(
            f"{signal.Signals(signum).name}: stopped at global step {step}; "
            f"checkpoint {last}. {resume_hint(cfg, output_dir)} (or ckpt_path=<that file>)."
        )
        return Outcome("interrupted", 128 + signum)
    pruned = next((cb for cb in callbacks if isinstance(cb, TrialPruning) and cb.ended_early), None)
    if pruned is not None:
        rank_zero_info(f"{pruned.ended_early}; checkpoints kept in {relative(last.parent)}")
        return Outcome("pruned", PRUNED_EXIT, pruned.value)
    # A callback that stops the run on purpose (session budget, swap) leaves it resumable.
    paused = stop_reason(callbacks)
    if paused:
        # The stopping callback saved last.ckpt at the batch boundary (laptrain/checkpoints/
        # stop.py); a save here, after fit, would count the interrupted epoch as done.
        rank_zero_info(
            f"stopped ({paused}) at global step {step}; checkpoint {last}. "
            f"{resume_hint(cfg, output_dir)}."
        )
        return Outcome("paused", PAUSED_EXIT)
    return None


def _interrupted(
    stop: SystemExit, stage: str, cfg: DictConfig, output_dir: Path, trainer: pl.Trainer
) -> Outcome:
    """A signal where GracefulStop does not hold the handlers (the sanity check, the test):
    Lightning exits 0 on ``SIGTERMException`` (loops/evaluation_loop.py:470-471) or 1 on Ctrl-C
    (trainer/call.py:56-65); either becomes 128 + the signal's number with the resume hint."""
    if isinstance(stop, SIGTERMException):
        signum = signal.SIGTERM
    elif isinstance(stop.__context__, KeyboardInterrupt):
        signum = signal.SIGINT
    else:
        raise stop
    last = written_last(cfg.paths.last_ckpt)
    kept = f"checkpoint {last}" if last else "no checkpoint yet, so it starts over"
    rank_zero_info(
        f"{signum.name}: stopped during the {stage} at global step {trainer.global_step}; "
        f"{kept}. {resume_hint(cfg, output_dir)}."
    )
    return Outcome("interrupted", 128 + signum)


def _test(
    cfg: DictConfig, trainer: pl.Trainer, model: Any, datamodule: Any, remake: Callable[[], Any]
) -> tuple[dict[str, float], Any]:
    """The fit's last metrics, updated by the test on the best checkpoint, and the module to export.
    Under ``trainer=fsdp`` the test runs on the module built again (``remake``): loading the
    checkpoint into the fitted one fails on its shards' sizes (Lightning #19015; docs/sweeps.md)."""
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    if cfg.get("test") and trainer.checkpoint_callback is not None:
        path = trainer.checkpoint_callback.best_model_path or None
        if shards_model_state(cfg.trainer.get("strategy")):  # units or only the root: any module
            path = path or written_last(cfg.paths.last_ckpt)
            if path is None:
                rank_zero_info(
                    "test skipped: under FSDP it loads a checkpoint, and none was written"
                )
                return metrics, model
            model = remake()
            fsdp_strategy_for(model, trainer.strategy)
        results = trainer.test(
            model, datamodule=datamodule, ckpt_path=path, weights_only=True, verbose=False
        )
        for result in results:
            metrics.update({k: float(v) for k, v in result.items()})
    return metrics, model


def resume_hint(cfg: DictConfig, output_dir: Path) -> str:
    """How to continue a stopped run: the same command, unless it started fresh (``resume=false``
    would take the next folder) or from ``ckpt_path`` (which would win over ``last.ckpt``)."""
    command = resume_command(output_dir)
    if (cfg.resume and not cfg.get("ckpt_path")) or not command:
        return "Resume with the same command"
    return f"Resume with: {command}"


def _best(
    trainer: pl.Trainer, callbacks: list[Any], trusted: TrustedGlobals
) -> tuple[str, str, float] | None:
    """The best checkpoint, its metric and score; after a ``ddp_spawn`` fit the main process gets
    back only the path (docs/sweeps.md), so the score comes from that checkpoint."""
    best = best_checkpoint(trainer)
    if best is None or math.isfinite(best[2]):
        return best
    score = best_score(callbacks, best[1], trusted)
    return best if score is None else (best[0], best[1], score)


def closing_lines(
    step: int,
    metrics: dict[str, float],
    best: tuple[str, str, float] | None,
    output_dir: Path,
    early: str | None = None,
) -> list[str]:
    """What a finished run ends with: its last step (and where early stopping stopped it), the
    final metrics (test ones on the best checkpoint), the best checkpoint and the run folder."""
    lines = [f"done at global step {step}" + (f": {early}" if early else "")]
    lines += metric_lines(metrics)
    if best:
        lines.append(f"best checkpoint: {relative(best[0])} ({best[1]} {best[2]:.4g})")
    report = " (report.md)" if (output_dir / "report.md").is_file() else ""
    lines.append(f"run folder: {relative(output_dir)}{report}")
    return lines
