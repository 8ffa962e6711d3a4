"""``laptrain preflight``: a job's memory estimate from the composed config alone, before any
weights are downloaded or loaded (docs/cli.md). Only a family with a ``sizing`` hook is estimated
(LoRA's: families/lora/sizing.py); the others are small enough for train.py's own preflight, and
their models are refused in one line. This module composes the config as ``train.py`` would."""

from __future__ import annotations

from typing import Any

from laptrain.family import family_of, installed_families


class PreflightInputError(ValueError):
    """The estimate cannot be made; the message is one line with the fix."""


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
