"""The device and precision a run trains with, decided once, before any data or model work: the
Trainer's arguments win over the profile's. :func:`decide_device` decides at the launch, before
Hydra makes a run folder, as a :class:`RunDevice` (kind, precision checked against the device and
the family, this rank's GPU), which the job and every later reader are given."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_info
from omegaconf import DictConfig

from laptrain.config.check import ConfigError
from laptrain.family import family_of
from laptrain.hardware.probe import DEVICE_KINDS, DeviceProbe, TorchProbe
from laptrain.hardware.profile import (
    ProfileError,
    fused_optimizer_unsafe,
    precision_warning,
    validate_precision,
)
from laptrain.hardware.run_device import RunDevice
from laptrain.ranks.processes import asked_devices, rank_cuda_index, requested_devices

FUSED_ON_MPS_FP16 = (
    "with 16-mixed on MPS: torch's fused Adam/AdamW on MPS ignored the grad scaler's skip of "
    "overflowing steps before pytorch PR #186360, so one overflow would write inf/NaN into the "
    "weights (docs/hardware.md §3)"
)
FUSED_UNDER_FSDP_FP16 = (
    "with 16-mixed under FSDP: Lightning leaves a fused optimizer's unscale to its kernel, so the "
    "ranks never share an overflow and their loss scales drift apart (docs/hardware.md §3)"
)


def requested_precision(cfg: DictConfig) -> str:
    """The precision the run asks for: ``trainer.precision``, else ``hardware.precision``."""
    return str(cfg.trainer.get("precision") or cfg.hardware.get("precision") or "32-true")


def requested_accelerator(cfg: DictConfig) -> str:
    """The accelerator the Trainer is given: ``trainer.accelerator``, else the profile's."""
    return str(cfg.trainer.get("accelerator") or cfg.hardware.get("accelerator") or "cpu")


def device_kind(accelerator: str) -> str:
    """The device kind (cpu, cuda, mps) an accelerator runs on here: ``gpu`` and ``auto`` in
    Lightning's own order (MPS, then CUDA, then CPU); a kind laptrain does not know, cpu."""
    if accelerator in ("gpu", "auto"):
        return next((k for k in ("mps", "cuda") if TorchProbe(k).available()), "cpu")
    return accelerator if accelerator in DEVICE_KINDS else "cpu"


def visible_cuda_devices() -> int:
    """The CUDA devices this process sees: what Lightning's ``auto`` and -1 train on
    (``CUDAAccelerator.auto_device_count`` is ``torch.cuda.device_count()``,
    lightning/pytorch/accelerators/cuda.py:98-100, lightning/fabric/accelerators/cuda.py:148-150)."""
    import torch

    return torch.cuda.device_count()


def device_count(devices: Any, kind: str, cuda_devices: Callable[[], int] | None = None) -> int:
    """The number of devices ``trainer.devices`` trains on with a ``kind`` accelerator, in every
    form Lightning takes; ``cuda_devices`` counts the visible GPUs. A value Lightning refuses is a
    one-line :class:`ConfigError`."""
    asked = requested_devices(devices, kind)
    if asked is not None:
        return asked
    found = (cuda_devices or visible_cuda_devices)()
    if found < 1:
        raise ConfigError(
            f"trainer.devices={devices} asks for every CUDA GPU and this machine has none: "
            "set hardware=cpu (or trainer.accelerator=cpu trainer.devices=1)"
        )
    return found


def plan_device(cfg: DictConfig) -> str:
    return device_kind(requested_accelerator(cfg))


def rank_device_index(cfg: DictConfig, kind: str) -> int | None:
    """The CUDA GPU this rank trains on, ``trainer.devices[local rank]`` in whichever form
    trainer.devices is written (laptrain.ranks.processes.rank_cuda_index); None off CUDA."""
    return rank_cuda_index(asked_devices(cfg)) if kind == "cuda" else None


def device_request(cfg: DictConfig) -> tuple[str, ...]:
    """What the device decision reads: accelerator, precision, devices, profile, model."""
    model = cfg.get("model")
    return (
        requested_accelerator(cfg),
        requested_precision(cfg),
        str(asked_devices(cfg)),
        str(cfg.hardware.get("name")),
        str(model.get("_target_")) if model is not None else "",
    )


def decide_device(cfg: DictConfig, say: Callable[[str], None] = rank_zero_info) -> RunDevice:
    """The run's device, once: :func:`check_device` and this rank's GPU."""
    kind = plan_device(cfg)
    precision = check_device(cfg, say=say)
    return RunDevice(kind, precision, rank_device_index(cfg, kind), device_request(cfg))


def job_device(cfg: DictConfig, launched: RunDevice | None) -> RunDevice:
    """The device of a job: the launch's decision when it answers this job's config, else the job's
    own (a sweep over a device setting; the launch warned once on its first job)."""
    if launched is not None and launched.asked == device_request(cfg):
        return launched
    return decide_device(cfg, say=rank_zero_info if launched is None else (lambda _: None))


def check_device(
    cfg: DictConfig, probe: DeviceProbe | None = None, say: Callable[[str], None] = rank_zero_info
) -> str:
    """The first check of every run: the asked device exists here and runs the asked precision,
    ``trainer.devices`` is a value Lightning takes, and the model's family trains at it. Returns the
    precision in Lightning's spelling; one warning for a precision that runs but is unmeasured."""
    kind = device_kind(requested_accelerator(cfg))
    probe = probe or TorchProbe(kind)
    if not probe.available():
        raise ProfileError(
            f"hardware={cfg.hardware.get('name')} trains on {kind}, which this machine cannot use: "
            "set hardware=auto (or hardware=cpu)"
        )
    device_count(asked_devices(cfg), kind)
    text = validate_precision(requested_precision(cfg), kind, probe.bf16_supported())
    family = family_of(cfg.get("model"))
    refused = family.refusal(kind, text) if family else None
    if refused:
        raise ProfileError(refused)
    warning = precision_warning(text, kind)
    if warning:
        say(warning)
    return text


def without_unsafe_fused(
    model_cfg: Mapping[str, Any],
    kind: str,
    precision: str,
    say: Callable[[str], None] = rank_zero_info,
    sharded: bool = False,
) -> Mapping[str, Any]:
    """``model_cfg`` with ``optimizer.fused`` off where a fused Adam/AdamW would train wrongly at
    16-mixed, saying so: on MPS (its kernel ignored the scaler's ``found_inf`` until pytorch PR
    #186360) and under FSDP (``sharded``: Lightning skips ``scaler.unscale_``, where the ranks agree
    on ``found_inf``, for a fused optimizer; docs/hardware.md §3)."""
    optimizer = model_cfg.get("optimizer")
    fused = isinstance(optimizer, Mapping) and bool(optimizer.get("fused"))
    if not fused or not fused_optimizer_unsafe(kind, precision, sharded):
        return model_cfg
    say(f"model.optimizer.fused=false {fused_risk(kind)}")
    return {**model_cfg, "optimizer": {**optimizer, "fused": False}}


def fused_risk(kind: str) -> str:
    """Why a fused Adam/AdamW trains wrongly where :func:`fused_optimizer_unsafe` says so."""
    return FUSED_ON_MPS_FP16 if kind == "mps" else FUSED_UNDER_FSDP_FP16
