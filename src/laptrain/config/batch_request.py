"""``data.batch_size`` as the user asks for it: a number, ``from_profile`` or ``auto``, spelled
once here; a run parses its request once (:func:`batch_request`) and passes it down."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

FROM_PROFILE = "from_profile"
AUTO = "auto"


@dataclass(frozen=True)
class BatchRequest:
    """A run's batch request: ``follows_profile`` when ``data.batch_size`` is ``from_profile``;
    then ``auto`` when ``hardware.batch_size`` is ``auto`` (the preflight picks), else ``size``,
    the profile's number. A data config with its own number keeps it (``size`` None here: the
    datamodule holds it). ``auto_checkpointing``: ``model.gradient_checkpointing`` is ``auto``."""

    follows_profile: bool
    auto: bool = False
    size: int | None = None
    auto_checkpointing: bool = False


def is_auto(value: object) -> bool:
    """Whether a setting asks the preflight to pick (``auto``: the batch, gradient checkpointing)."""
    return str(value).lower() == AUTO


def batch_follows_profile(cfg: DictConfig) -> bool:
    return str(cfg.data.get("batch_size")) == FROM_PROFILE


def batch_request(cfg: DictConfig) -> BatchRequest:
    """The run's :class:`BatchRequest`, read once from ``data.batch_size``, ``hardware.batch_size``
    and ``model.gradient_checkpointing``."""
    model = cfg.get("model") or {}
    checkpointing = is_auto(model.get("gradient_checkpointing"))
    if not batch_follows_profile(cfg):
        return BatchRequest(follows_profile=False, auto_checkpointing=checkpointing)
    asked = cfg.hardware.get("batch_size")
    if is_auto(asked):
        return BatchRequest(True, auto=True, auto_checkpointing=checkpointing)
    return BatchRequest(True, size=int(asked), auto_checkpointing=checkpointing)
