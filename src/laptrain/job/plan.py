"""The run plan: every machine-dependent choice of a run, decided once, frozen, passed down.

``build_run_plan`` is where the hardware profile, the configs and the memory preflight meet;
nothing writes back into the config. ``batch_size: from_profile`` in a data YAML takes
``hardware.batch_size`` (a number or ``auto``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from laptrain.config.batch_request import BatchRequest, batch_request
from laptrain.config.check import ConfigError
from laptrain.data.contracts import EvaluatesInOtherBatches, Loader, loader_settings
from laptrain.job.datamodule_settings import (
    BATCH,
    LOADER_KNOBS,
    TakesBatchSizes,
    find_setting,
    set_setting,
    users_datamodule,
)
from laptrain.launch.device import RunDevice, device_count, requested_accelerator
from laptrain.model.contracts import ChunksBatches
from laptrain.preflight.request import PlannedRun, PlanRequest
from laptrain.ranks.processes import asked_devices, shards_model_state

if TYPE_CHECKING:
    from laptrain.preflight.planner import BatchPlanner


@dataclass(frozen=True)
class RunPlan:
    """What this run does on this machine, and why. ``micro_batch`` is what one forward/backward
    runs, ``loader_batch`` what the loader yields (they differ for TRM's carry slots); ``memory``
    the preflight's record (``*_gb`` in GiB); ``devices`` how many train per node, ``devices_asked``
    the ``trainer.devices`` value as written."""

    profile: str
    device: str
    accelerator: str
    devices: int
    precision: str
    loader_batch: int
    micro_batch: int
    eval_batch: int
    accumulation: int
    workers: int
    pin_memory: bool
    persistent_workers: bool
    threads: int | None
    batch_from_profile: bool
    memory: Mapping[str, Any] | None = None
    reasons: Mapping[str, str] = field(default_factory=dict)
    nodes: int = 1  # trainer.num_nodes: devices is per node
    gradient_checkpointing: bool | None = (
        None  # model.gradient_checkpointing=auto decided; else None
    )
    devices_asked: int | str | list[int] | None = None  # None: ``devices``
    # settings the run sets on a datamodule that is not laptrain's (planned_datamodule): name ->
    # where Lightning's lookup finds it, e.g. {"batch_size": "BlobsDataModule.hparams.batch_size"}
    set_on: Mapping[str, str] = field(default_factory=dict)
    # loader settings such a datamodule decides itself (neither an attribute nor hparams)
    loader_own: tuple[str, ...] = ()
    datamodule_name: str = ""

    @property
    def effective_batch(self) -> int:
        """Samples per optimizer step over all ranks (devices x nodes)."""
        return self.loader_batch * self.accumulation * self.devices * self.nodes

    def trainer_kwargs(self) -> dict[str, Any]:
        return {
            "accelerator": self.accelerator,
            "devices": self.devices if self.devices_asked is None else self.devices_asked,
            "precision": self.precision,
            "accumulate_grad_batches": self.accumulation,
        }

    def summary_lines(self) -> list[str]:
        def why(key: str) -> str:
            return f" ({self.reasons[key]})" if self.reasons.get(key) else ""

        chunk = (
            f" (chunks of the {self.loader_batch}-sample batch)"
            if self.micro_batch != self.loader_batch
            else ""
        )
        lines = [
            f"hardware profile: {self.profile}",
            f"device: {self.device} ({self.devices} device(s)"
            + (f" x {self.nodes} nodes)" if self.nodes > 1 else ")"),
            f"precision: {self.precision}{why('precision')}",
            f"micro batch size: {self.micro_batch}{chunk}{why('batch')}",
            f"gradient accumulation: {self.accumulation}{why('accumulation')}",
            f"effective batch size: {self.effective_batch}",
            *self._loader_lines(),
            f"torch threads: {self.threads if self.threads else 'torch default'}{why('threads')}",
        ]
        if self.gradient_checkpointing is not None and not self.memory:
            lines.append(
                f"gradient checkpointing: {'on' if self.gradient_checkpointing else 'off'}"
                f"{why('checkpointing')}"
            )
        if not self.memory and self.reasons.get("memory"):
            lines.append(f"memory: {self.reasons['memory']}")
        if self.memory and not self.memory.get("lines"):
            lines.append(
                f"memory: estimate {self.memory['estimate_gb']:.2f} GiB of budget "
                f"{self.memory['budget_gb']:.2f} GiB ({self.memory['budget_source']})"
            )
        return lines

    def _loader_lines(self) -> list[str]:
        """Workers and pin_memory as the loaders get them, or those the datamodule decides."""
        lines = []
        if "num_workers" not in self.loader_own:
            lines.append(
                f"dataloader workers: {self.workers}"
                + (" (persistent)" if self.persistent_workers else "")
                + self._on("num_workers")
            )
        if "pin_memory" not in self.loader_own:
            lines.append(f"pin_memory: {self.pin_memory}{self._on('pin_memory')}")
        if self.loader_own:
            names = ", ".join(self.loader_own)
            lines.append(
                f"{names}: {self.datamodule_name} sets its own (the profile's would reach its "
                f"loaders as a {self.loader_own[0]} attribute or hparams entry)"
            )
        return lines

    def _on(self, name: str) -> str:
        return f" (hardware.{name}, set on {self.set_on[name]})" if name in self.set_on else ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["effective_batch"] = self.effective_batch
        return data


def build_run_plan(
    cfg: DictConfig,
    model: Any,
    datamodule: Any,
    device: RunDevice,
    output_dir: Path | None = None,
    cache_dir: Path | None = None,
    preflight: BatchPlanner | None = None,
    batch: BatchRequest | None = None,
) -> RunPlan:
    """Decide the run's batch, accumulation, device and loader settings once, on the launch's
    ``device``. Raises ValueError on contradicting settings, PreflightError when it cannot fit."""
    hw, trainer = cfg.hardware, cfg.trainer
    reasons: dict[str, str] = {}
    asked = _asked(cfg, model, datamodule, reasons, batch or batch_request(cfg), device.kind)
    checked = _checked_batch(
        cfg, model, datamodule, asked, device, reasons, preflight, output_dir, cache_dir
    )
    loading = _loading(cfg, model, datamodule, asked.follows, checked.loader_batch, reasons)
    set_on = {**asked.set_on, **loading.set_on}
    return RunPlan(
        profile=str(hw.get("name")),
        device=asked.kind,
        accelerator=asked.accelerator,
        devices=asked.devices,
        devices_asked=asked.devices_asked,
        precision=device.precision,
        batch_from_profile=asked.follows,
        reasons=reasons,
        nodes=int(trainer.get("num_nodes") or 1),
        set_on=set_on,
        loader_own=loading.loader_own,
        datamodule_name=type(datamodule).__name__,
        **asdict(checked),
        **{k: v for k, v in asdict(loading).items() if k not in ("set_on", "loader_own")},
    )


def planned_datamodule(plan: RunPlan, model: Any, datamodule: Any) -> Any:
    """The datamodule that trains, with the plan's batch and loader settings: laptrain's own a copy
    from ``with_batch_sizes``, any other the same object, set through Lightning's lookup before
    its loaders are built."""
    if plan.batch_from_profile and isinstance(datamodule, TakesBatchSizes):
        datamodule = datamodule.with_batch_sizes(plan.loader_batch, plan.eval_batch)
    values = {
        BATCH: plan.loader_batch,
        "num_workers": plan.workers,
        "pin_memory": plan.pin_memory,
        "persistent_workers": plan.persistent_workers,
    }
    for name in plan.set_on:
        set_setting(model if name == BATCH else None, datamodule, name, values[name])
    return datamodule


@dataclass(frozen=True)
class _Asked:
    """What the config asks before the preflight: device, devices, batch and accumulation."""

    accelerator: str
    kind: str  # the device kind it runs on (the launch's RunDevice.kind)
    devices: int  # how many train: the count of ``devices_asked`` on this accelerator
    devices_asked: int | str | list[int]
    follows: bool  # the data's batch_size is from_profile
    auto: bool  # and the profile's is auto
    loader_batch: int
    accumulation: int
    auto_checkpointing: bool
    set_on: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Batch:
    """The plan's batch fields after the preflight: loader batch, accumulation, its record."""

    loader_batch: int
    accumulation: int
    memory: dict[str, Any] | None = None
    gradient_checkpointing: bool | None = None


@dataclass(frozen=True)
class _Loading:
    """The plan's loading fields: micro batch, eval batch, workers and threads."""

    micro_batch: int
    eval_batch: int
    workers: int
    pin_memory: bool
    persistent_workers: bool
    threads: int | None
    set_on: dict[str, str] = field(default_factory=dict)
    loader_own: tuple[str, ...] = ()


def _asked(
    cfg: DictConfig,
    model: Any,
    datamodule: Any,
    reasons: dict[str, str],
    request: BatchRequest,
    kind: str,
) -> _Asked:
    """The accelerator, devices, accumulation and batch the config asks for (the trainer's
    settings win over the hardware profile's; the data's batch unless it follows the profile)."""
    trainer = cfg.trainer
    follows, auto = request.follows_profile, request.auto
    accelerator = requested_accelerator(cfg)
    devices_asked = asked_devices(cfg)
    devices = device_count(devices_asked, kind)
    accumulation = int(trainer.get("accumulate_grad_batches") or 1)
    set_on: dict[str, str] = {}
    if follows:
        loader_batch = 1 if request.size is None else request.size
        reasons["batch"] = "hardware.batch_size"
        if users_datamodule(datamodule) and not isinstance(datamodule, TakesBatchSizes):
            set_on[BATCH] = _batch_holder(model, datamodule)
            reasons["batch"] += f", set on {set_on[BATCH]}"
    else:
        loader_batch, reasons["batch"] = _own_batch(model, datamodule)
    return _Asked(
        accelerator,
        kind,
        devices,
        devices_asked,
        follows,
        auto,
        loader_batch,
        accumulation,
        request.auto_checkpointing,
        set_on,
    )


def _batch_holder(model: Any, datamodule: Any) -> str:
    """Where a datamodule not laptrain's takes the profile's batch, or a one-line refusal."""
    found = find_setting(model, datamodule, BATCH)
    if found is None:
        name = type(datamodule).__name__
        raise ConfigError(
            f"data.batch_size=from_profile: {name} has no batch size to set (no batch_size "
            f"attribute or hparams entry on it or on the model): take a batch_size argument, "
            f"call self.save_hyperparameters() in {name}.__init__ and build its loaders with "
            "batch_size=self.hparams.batch_size, or set data.batch_size=<n>"
        )
    return found.where


def _own_batch(model: Any, datamodule: Any) -> tuple[int, str]:
    """The batch a datamodule asks for itself (``data.batch_size=<n>``) and the reason shown."""
    if not users_datamodule(datamodule):
        return int(datamodule.batch_size), "data.batch_size"
    found = find_setting(model, datamodule, BATCH)
    if found is None or found.value is None:
        name = type(datamodule).__name__
        raise ConfigError(
            f"{name} has no batch size laptrain can read (no batch_size attribute or hparams "
            f"entry on it or on the model): take a batch_size argument and call "
            f"self.save_hyperparameters() in {name}.__init__"
        )
    return int(found.value), f"data.batch_size, read from {found.where}"


def _checked_batch(
    cfg: DictConfig,
    model: Any,
    datamodule: Any,
    asked: _Asked,
    device: RunDevice,
    reasons: dict[str, str],
    planner: BatchPlanner | None,
    output_dir: Path | None,
    cache_dir: Path | None,
) -> _Batch:
    """The batch the preflight picks (``auto``) or checks (fixed), or as asked when it is off;
    ``planner`` is the one that sizes (chosen when None) on ``device``."""
    options = cfg.get("preflight") or {}
    asked_batch = _Batch(
        asked.loader_batch, asked.accumulation, None, False if asked.auto_checkpointing else None
    )
    if not options.get("enabled", True):
        return _unchecked(asked, asked_batch, reasons)
    from laptrain.preflight.planner import choose_planner
    from laptrain.preflight.shared_plan import plan_on_rank_0

    planner = planner or choose_planner(model, datamodule)
    request = _plan_request(cfg, asked, datamodule, options)
    # torchrun / srun ranks start together: rank 0 plans and every rank takes its plan
    strategy = cfg.trainer.get("strategy")
    if OmegaConf.is_config(strategy):
        strategy = OmegaConf.to_container(strategy, resolve=True)
    found = _or_not_measured(
        lambda: plan_on_rank_0(
            lambda: planner(model, datamodule, request, device, output_dir, cache_dir),
            strategy,
            device.kind,
            device.index,
        ),
        asked,
        reasons,
    )
    return _answered(found, asked, asked_batch, reasons)


def _unchecked(asked: _Asked, asked_batch: _Batch, reasons: dict[str, str]) -> _Batch:
    """The batch as asked, with the preflight off (``auto`` refused)."""
    if asked.auto:
        raise ValueError(
            "hardware.batch_size=auto needs preflight.enabled=true (or set hardware.batch_size=<n>)"
        )
    if asked.auto_checkpointing:
        reasons["checkpointing"] = (
            "model.gradient_checkpointing=auto with the preflight off: set it to true to force it"
        )
    return asked_batch


def _plan_request(cfg: DictConfig, asked: _Asked, datamodule: Any, options: Any) -> PlanRequest:
    """What the planner is asked: the batch, the ``preflight`` options, the profile's budget and
    loader settings, and the run as its Trainer will have it (its length and ranks)."""
    hw, trainer = cfg.hardware, cfg.trainer
    run = PlannedRun(
        trainer.get("max_epochs"),
        int(trainer.get("max_steps", -1)),
        asked.accumulation,
        asked.devices,
        int(trainer.get("num_nodes") or 1),
        shards_model_state(trainer.get("strategy")),
    )
    return PlanRequest(
        auto=asked.auto,
        size=asked.loader_batch,
        accumulation=asked.accumulation,
        effective_batch=options.get("effective_batch_size"),
        max_batch=int(options.get("max_batch_size") or 256),
        multiple=int(hw.get("batch_multiple", 1) or 1),
        memory_fraction=float(hw.get("memory_fraction", 0.8)),
        memory_budget_gb=hw.get("memory_budget_gb"),
        auto_checkpointing=asked.auto_checkpointing,
        verify=bool(options.get("verify", False)),
        option="hardware.batch_size" if asked.follows else "data.batch_size",
        loader=loader_settings(datamodule, hw),
        run=run,
    )


def _or_not_measured(measure: Any, asked: _Asked, reasons: dict[str, str]) -> Any:
    """``measure()``, or None with the reason it could not measure in ``reasons["memory"]``
    (a fixed batch trains unmeasured; ``auto`` is refused in one line)."""
    from laptrain.preflight.measured import NotMeasured

    try:
        return measure()
    except NotMeasured as why:
        if asked.auto:
            raise ValueError(
                f"hardware.batch_size=auto: the preflight cannot measure this job ({why}): "
                "set hardware.batch_size=<n>"
            ) from why
        reasons["memory"] = f"not estimated: {why}"
        return None


def _answered(found: Any, asked: _Asked, asked_batch: _Batch, reasons: dict[str, str]) -> _Batch:
    """How the preflight's answer (None: nothing measured) changes the batch and accumulation."""
    if found is None:  # a fixed batch (auto with nothing measured is refused before)
        reasons.setdefault("memory", "not estimated")
        if asked.auto_checkpointing:
            reasons["checkpointing"] = "model.gradient_checkpointing=auto, nothing measured"
        return asked_batch
    if asked.auto:
        reasons["batch"] = "batch_size auto: the largest that fits the memory budget" + (
            f", set on {asked.set_on[BATCH]}" if BATCH in asked.set_on else ""
        )
    if found.accumulation != asked.accumulation:
        reasons["accumulation"] = f"keeps preflight.effective_batch_size={found.effective_target}"
    return _Batch(
        loader_batch=found.micro_batch if asked.auto else asked.loader_batch,
        accumulation=found.accumulation,
        memory={  # *_gb: GiB (bytes / 2^30); the keys keep their names for readers
            "estimate_gb": found.estimate.total / 1024**3,
            "budget_gb": found.budget.bytes / 1024**3,
            "budget_source": found.budget.source,
            "lines": found.summary_lines(batch=False),
        },
        gradient_checkpointing=(
            found.checkpointing if asked.auto_checkpointing else asked_batch.gradient_checkpointing
        ),
    )


def _loading(
    cfg: DictConfig,
    model: Any,
    datamodule: Any,
    follows: bool,
    loader_batch: int,
    reasons: dict[str, str],
) -> _Loading:
    """The micro batch (a model's own chunks), the eval batch, loader workers and torch threads."""
    chunk = model.micro_batch_size if isinstance(model, ChunksBatches) else None
    micro_batch = min(int(chunk), loader_batch) if chunk else loader_batch
    if chunk:
        reasons["batch"] = f"the model's micro_batch_size of {loader_batch} carry slots"
    eval_batch = loader_batch
    if not follows:
        own = (
            datamodule.eval_batch_size if isinstance(datamodule, EvaluatesInOtherBatches) else None
        )
        eval_batch = int(own or loader_batch)
    hw = cfg.hardware
    threads = hw.get("torch_threads")
    if threads:
        reasons["threads"] = "hardware.torch_threads"
    set_on: dict[str, str] = {}
    own: tuple[str, ...] = ()
    if users_datamodule(datamodule):
        loader, set_on, own = _user_loader(cfg.data, datamodule, hw)
    else:
        loader = loader_settings(datamodule, hw)
    workers = loader.num_workers
    return _Loading(
        micro_batch=micro_batch,
        eval_batch=eval_batch,
        workers=workers,
        pin_memory=loader.pin_memory,
        persistent_workers=loader.persistent_workers and workers > 0,
        threads=int(threads) if threads else None,
        set_on=set_on,
        loader_own=own,
    )


def _user_loader(
    data: DictConfig, datamodule: Any, hw: DictConfig
) -> tuple[Loader, dict[str, str], tuple[str, ...]]:
    """Loader settings for a datamodule that is not laptrain's: its data config's value is kept, the
    profile's goes where Lightning's lookup finds the name, the rest it decides (returned third)."""
    profile = loader_settings(None, hw)
    values: dict[str, Any] = {}
    set_on: dict[str, str] = {}
    own = []
    for name in LOADER_KNOBS:
        found = find_setting(None, datamodule, name)
        if name in data and found is not None:
            values[name] = found.value
        elif found is not None:
            values[name] = getattr(profile, name)
            set_on[name] = found.where
        else:
            values[name] = data.get(name, getattr(profile, name))
            own += [] if name in data else [name]
    loader = Loader(
        num_workers=int(values["num_workers"] or 0),
        persistent_workers=bool(values["persistent_workers"]),
        pin_memory=bool(values["pin_memory"]),
    )
    return loader, set_on, tuple(own)
