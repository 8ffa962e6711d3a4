"""The device and precision a run trains with, decided once, before any data or model work.

The Trainer's own arguments win over the profile's (``trainer.precision=bf16-mixed`` on the
command line is what Lightning gets), so the precision is read here in that order and every later
reader (the plan, the memory preflight, the summary) is given this value instead of reading the
config again.
"""

from __future__ import annotations

from collections.abc import Callable

from lightning.pytorch.utilities.rank_zero import rank_zero_info
from omegaconf import DictConfig

from laptrain.hardware.probe import DEVICE_KINDS, DeviceProbe, TorchProbe
from laptrain.hardware.profile import ProfileError, precision_warning, validate_precision
from laptrain.model.families import family_of


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


def check_device(
    cfg: DictConfig, probe: DeviceProbe | None = None, say: Callable[[str], None] = rank_zero_info
) -> str:
    """The first check of every run: the device the trainer is asked for exists here and can run
    the precision asked for (preflight on or off), and the model's family trains at it (the
    family registry's rule). Returns the precision in Lightning's spelling; a precision that runs
    but is unmeasured gets one warning."""
    kind = device_kind(requested_accelerator(cfg))
    probe = probe or TorchProbe(kind)
    if not probe.available():
        raise ProfileError(
            f"hardware={cfg.hardware.get('name')} trains on {kind}, which this machine cannot use: "
            "set hardware=auto (or hardware=cpu)"
        )
    text = validate_precision(requested_precision(cfg), kind, probe.bf16_supported())
    family = family_of(cfg.get("model"))
    refused = family.refusal(kind, text) if family else None
    if refused:
        raise ProfileError(refused)
    warning = precision_warning(text, kind)
    if warning:
        say(warning)
    return text
