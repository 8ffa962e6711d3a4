"""The run plan: every machine-dependent choice of a run, decided once, frozen, passed down.

``build_run_plan`` is the one place where the hardware profile, the data config, the trainer
config and the memory preflight meet. The datamodule gets its batch sizes from the plan (a new
datamodule via ``with_batch_sizes``), the Trainer gets accelerator, devices, precision and
accumulation from ``trainer_kwargs()``; nothing writes back into the config. The console summary
and ``run_info.json`` are rendered from the plan, each value with the reason it was chosen.

Whether a datamodule's batch follows the profile is an explicit config value: ``batch_size:
from_profile`` in the data YAML means "the hardware profile's micro batch" (``hardware.batch_size``,
a number or ``auto`` = the preflight picks). A data config with a number (TRM: its carry slots)
keeps it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from laptrain.config.batch_request import AUTO, batch_follows_profile, is_auto
from laptrain.data.contracts import EvaluatesInOtherBatches, loader_settings
from laptrain.model.contracts import ChunksBatches


@dataclass(frozen=True)
class RunPlan:
    """What this run does on this machine, and why.

    ``micro_batch`` is what one forward/backward really runs (TRM: its chunk of carry slots);
    ``loader_batch`` what the training loader yields (TRM: the carry slots); for the text families
    they are equal. ``memory`` is the preflight's record (estimate, budget) when it ran.
    """

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

    @property
    def effective_batch(self) -> int:
        """Samples per optimizer step over all ranks (devices x nodes)."""
        return self.loader_batch * self.accumulation * self.devices * self.nodes

    def trainer_kwargs(self) -> dict[str, Any]:
        return {
            "accelerator": self.accelerator,
            "devices": self.devices,
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
            f"dataloader workers: {self.workers}"
            + (" (persistent)" if self.persistent_workers else ""),
            f"pin_memory: {self.pin_memory}",
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
                f"memory: estimate {self.memory['estimate_gb']:.2f} GB of budget "
                f"{self.memory['budget_gb']:.2f} GB ({self.memory['budget_source']})"
            )
        return lines

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["effective_batch"] = self.effective_batch
        return data


def plan_device(cfg: DictConfig) -> str:
    """The device kind (cpu, cuda, mps) the trainer config asks for."""
    return _device_kind(
        str(cfg.trainer.get("accelerator") or cfg.hardware.get("accelerator") or "cpu")
    )


def _device_kind(accelerator: str) -> str:
    if accelerator in ("cpu", "cuda", "mps"):
        return accelerator
    from laptrain.hardware.probe import TorchProbe

    return next((k for k in ("mps", "cuda") if TorchProbe(k).available()), "cpu")


def build_run_plan(
    cfg: DictConfig,
    model: Any,
    datamodule: Any,
    precision: str,
    output_dir: Path | None = None,
    cache_dir: Path | None = None,
    preflight: Any = None,
) -> RunPlan:
    """Decide the run's batch, accumulation, device and loader settings once.

    ``preflight`` is ``laptrain.preflight.batch.preflight_for_run`` (injectable for tests). With
    ``hardware.batch_size: auto`` the preflight must run; a fixed batch is still checked by it.

    Raises:
        ValueError: ``auto`` with the preflight disabled, or settings that contradict each other.
        PreflightError: the job does not fit (from the preflight).
    """
    hw = cfg.hardware
    options = cfg.get("preflight") or {}
    trainer = cfg.trainer
    follows = batch_follows_profile(cfg)
    profile_batch = hw.get("batch_size")
    auto = follows and is_auto(profile_batch)
    reasons: dict[str, str] = {}
    accelerator = str(trainer.get("accelerator") or hw.get("accelerator") or "cpu")
    devices = trainer.get("devices") if isinstance(trainer.get("devices"), int) else None
    devices = int(devices or hw.get("devices") or 1)
    accumulation = int(trainer.get("accumulate_grad_batches") or 1)
    if follows:
        loader_batch = 1 if auto else int(profile_batch)
        reasons["batch"] = "hardware.batch_size"
    else:
        loader_batch = int(datamodule.batch_size)
        reasons["batch"] = "data.batch_size"
    memory = None
    auto_checkpointing = is_auto(cfg.model.get("gradient_checkpointing"))
    checkpointing = False if auto_checkpointing else None
    if not options.get("enabled", True):
        if auto:
            raise ValueError(
                "hardware.batch_size=auto needs preflight.enabled=true (or set hardware.batch_size=<n>)"
            )
        if auto_checkpointing:
            reasons["checkpointing"] = (
                "model.gradient_checkpointing=auto with the preflight off: set it to true to force it"
            )
    else:
        if preflight is None:
            from laptrain.preflight.batch import preflight_for_run as preflight
        profile = OmegaConf.to_container(hw, resolve=True)
        assert isinstance(profile, dict)
        profile["devices"] = devices
        profile["precision"] = (
            precision  # the Trainer's (trainer.precision wins over the profile's)
        )
        profile["accelerator"] = accelerator
        from laptrain.config.scale_out import shards_model_state  # (scale_out imports config_check)

        if shards_model_state(trainer.get("strategy")):  # FSDP: state split over all ranks
            profile["shards"] = devices * int(trainer.get("num_nodes") or 1)
        profile["batch_size"] = AUTO if auto else loader_batch
        found = preflight(
            model,
            datamodule,
            profile,
            accumulation=accumulation,
            effective_batch=options.get("effective_batch_size"),
            max_batch=int(options.get("max_batch_size") or 256),
            verify=bool(options.get("verify", False)),
            output_dir=output_dir,
            cache_dir=cache_dir,
            **({"checkpointing": AUTO} if auto_checkpointing else {}),
        )
        if found is not None:
            if auto_checkpointing:
                checkpointing = found.checkpointing
            if auto:
                loader_batch = found.micro_batch
                reasons["batch"] = "batch_size auto: the largest that fits the memory budget"
            if found.accumulation != accumulation:
                reasons["accumulation"] = (
                    f"keeps preflight.effective_batch_size={found.effective_target}"
                )
            accumulation = found.accumulation
            memory = {
                "estimate_gb": found.estimate.total / 1024**3,
                "budget_gb": found.budget.bytes / 1024**3,
                "budget_source": found.budget.source,
                "lines": found.summary_lines(batch=False),
            }
        elif auto:
            raise ValueError(
                "hardware.batch_size=auto needs a model the preflight can measure: set "
                "hardware.batch_size=<n>"
            )
        else:
            reasons["memory"] = "not estimated: the preflight measures transformers models only"
            if auto_checkpointing:
                reasons["checkpointing"] = "model.gradient_checkpointing=auto, nothing measured"
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
    threads = hw.get("torch_threads")
    if threads:
        reasons["threads"] = "hardware.torch_threads"
    loader = loader_settings(datamodule, hw)
    workers, persistent = loader.num_workers, loader.persistent_workers
    return RunPlan(
        profile=str(hw.get("name")),
        device=_device_kind(accelerator),
        accelerator=accelerator,
        devices=devices,
        precision=precision,
        loader_batch=loader_batch,
        micro_batch=micro_batch,
        eval_batch=eval_batch,
        accumulation=accumulation,
        workers=workers,
        pin_memory=loader.pin_memory,
        persistent_workers=persistent and workers > 0,
        threads=int(threads) if threads else None,
        batch_from_profile=follows,
        memory=memory,
        reasons=reasons,
        nodes=int(trainer.get("num_nodes") or 1),
        gradient_checkpointing=checkpointing,
    )
