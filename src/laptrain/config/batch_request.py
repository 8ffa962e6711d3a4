"""``data.batch_size`` as the user asks for it: a number, ``from_profile`` (the hardware profile's
batch) or ``auto`` (the memory preflight picks). Read by the pre-check, the plan and the preflight,
so the three spellings are defined once here."""

from __future__ import annotations

from omegaconf import DictConfig

FROM_PROFILE = "from_profile"
AUTO = "auto"


def is_auto(value: object) -> bool:
    """Whether a setting asks the preflight to pick (``auto``: the batch, gradient checkpointing)."""
    return str(value).lower() == AUTO


def batch_follows_profile(cfg: DictConfig) -> bool:
    """Whether this run's data takes its batch from the hardware profile (``from_profile``)."""
    return str(cfg.data.get("batch_size")) == FROM_PROFILE
