"""The batch planner of a run, chosen once (:func:`choose_planner`): :func:`estimated` sizes a
transformers model from its shapes (batch.py), :func:`measured` trains a copy of any module
(measured.py); both take ``(model, datamodule, hardware, **plan_settings(...))`` and return a
``Plan``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from laptrain.config.batch_request import AUTO


class BatchPlanner(Protocol):
    """:func:`estimated`, :func:`measured`, or a stand-in in tests."""

    def __call__(
        self, model: Any, datamodule: Any, hardware: Mapping[str, Any], **settings: Any
    ) -> Any: ...


def plan_settings(
    options: Mapping[str, Any],
    accumulation: int,
    output_dir: Path | None,
    cache_dir: Path | None,
    auto_checkpointing: bool,
    option: str,
    run: Any,
) -> dict[str, Any]:
    """What both planners are given: the ``preflight`` config's options, the configured
    accumulation, the run folder (``preflight.json``), the cache, whether
    ``model.gradient_checkpointing`` is ``auto``, the setting a fixed batch came from, and the
    run as its Trainer will have it (measured.PlannedRun)."""
    return {
        "accumulation": accumulation,
        "effective_batch": options.get("effective_batch_size"),
        "max_batch": int(options.get("max_batch_size") or 256),
        "output_dir": output_dir,
        "cache_dir": cache_dir,
        "verify": bool(options.get("verify", False)),
        "checkpointing": AUTO if auto_checkpointing else None,
        "option": option,
        "run": run,
    }


def estimated(model: Any, datamodule: Any, hardware: Mapping[str, Any], **settings: Any) -> Any:
    """The estimate from the model's shapes (``laptrain.preflight.batch.preflight_for_run``)."""
    from laptrain.preflight.batch import preflight_for_run

    settings.pop("option"), settings.pop("run")
    return preflight_for_run(model, datamodule, hardware, **settings)


def measured(model: Any, datamodule: Any, hardware: Mapping[str, Any], **settings: Any) -> Any:
    """The measurement of a copy of the module (``measured.measured_preflight_for_run``)."""
    from laptrain.preflight.measured import measured_preflight_for_run

    settings.pop("verify"), settings.pop("checkpointing")
    return measured_preflight_for_run(model, datamodule, hardware, **settings)


def choose_planner(model: Any, datamodule: Any) -> BatchPlanner:
    """The estimate for a transformers model with a sequence length, else the measurement."""
    from torch import nn

    from laptrain.preflight.activations import find_hf_model
    from laptrain.preflight.batch import training_length

    hf_model = find_hf_model(model) if isinstance(model, nn.Module) else None
    return estimated if hf_model is not None and training_length(datamodule)[0] else measured
