"""``laptrain preflight``: a job's memory estimate from the composed config alone, before any
weights are downloaded or loaded (docs/cli.md). Only a family with a ``sizing`` hook is estimated
(LoRA's: families/lora/sizing.py); the others are small enough for train.py's own preflight, and
their models are refused in one line. This module composes the config as ``train.py`` would and
gives the profile's memory budget."""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from laptrain.family import family_of, installed_families

GiB = 1024**3


class PreflightInputError(ValueError):
    """The estimate cannot be made; the message is one line with the fix."""


@dataclass(frozen=True)
class BudgetChoice:
    bytes: float
    source: str
    bf16: bool  # whether the target device computes in bfloat16


def _is_apple(profile: Mapping[str, Any]) -> bool:
    return profile.get("accelerator") == "mps" or str(profile.get("name", "")).startswith("macbook")


def choose_budget(hw: Mapping[str, Any]) -> BudgetChoice:
    """The profile's budget: measured on this machine when the profile is for it, else
    ``hardware.memory_budget_gb``; an Apple profile on another machine without it is refused."""
    from laptrain.hardware.probe import TorchProbe
    from laptrain.preflight.budget import device_budget

    kind = str(hw.get("accelerator", "cpu"))
    given = hw.get("memory_budget_gb")
    fraction = float(hw.get("memory_fraction", 0.8))
    probe = TorchProbe(kind)
    here = probe.available() and (not _is_apple(hw) or platform.system() == "Darwin")
    if here:
        budget = device_budget(probe, fraction, given)
        return BudgetChoice(budget.bytes, f"{budget.source} (this machine)", probe.bf16_supported())
    name = hw.get("name", kind)
    if given:
        return BudgetChoice(
            float(given) * GiB,
            f"hardware.memory_budget_gb={given} (hardware={name} is for another machine)",
            kind != "cpu",
        )
    where = "a Mac" if _is_apple(hw) else f"a {kind.upper()} machine"
    raise PreflightInputError(
        f"hardware={name} is for {where}, not this one: its memory budget cannot be probed here; "
        f"add hardware.memory_budget_gb=<GiB> (e.g. 0.65 x 0.75 x the Mac's RAM for an MPS profile)"
    )


def _composed(overrides: list[str]) -> Any:
    from laptrain.config.check import compose_argv
    from laptrain.hardware.auto import resolve_hardware_argv
    from laptrain.project import conf_dir

    argv, _ = resolve_hardware_argv(["train.py", *overrides])
    return compose_argv(argv, str(conf_dir()))


def preflight_report(overrides: list[str]) -> tuple[list[str], bool]:
    """The lines ``laptrain preflight`` prints, and whether the job fits: the sizing hook of the
    model's family, on the config composed as train.py would. Raises
    ``PreflightInputError``/``ConfigError``/``OSError`` with one line."""
    from omegaconf import OmegaConf

    cfg = _composed(overrides)
    model_cfg = OmegaConf.to_container(cfg.model, resolve=False)
    family = family_of(model_cfg)
    if family is None or family.sizing is None:
        sized = ", ".join(
            f"the {f.name} family ({f.summary})" for f in installed_families() if f.sizing
        )
        raise PreflightInputError(
            f"laptrain preflight estimates from the config only {sized}; model "
            f"{model_cfg.get('_target_')} is measured by train.py's own preflight before training"
        )
    return family.sizing(cfg, model_cfg)
