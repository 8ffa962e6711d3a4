"""The callbacks a run builds: only those that can act on it, decided once before any is built.
Lightning calls every per-batch hook of every callback at every step (``_call_callback_hooks``,
lightning/pytorch/trainer/call.py), so a disabled entry, a session budget without a limit and
early stopping without a patience are not built at all."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from laptrain.callbacks.early_stopping import EarlyStopping
from laptrain.callbacks.session_budget import SessionBudget
from laptrain.config.check import BUILD_SWITCH

# conf/callbacks entries that guard the run, with their name on the console's ``guards:`` line
GUARDS = {
    "graceful_stop": "graceful stop",
    "nonfinite_guard": "nonfinite",
    "memory_monitor": "memory",
    "thermal_guard": "thermal",
    "power_guard": "power",
    "oom_backoff": "OOM backoff",
    "session_budget": "session budget",
}


def acts(spec: Mapping[str, Any], model: Any) -> bool:
    """Whether the enabled conf/callbacks entry ``spec`` (resolved) can act on ``model``'s run."""
    target = get_object(spec["_target_"])
    if isinstance(target, type) and issubclass(target, SessionBudget):
        return spec.get("max_minutes") is not None or spec.get("max_epochs") is not None
    if isinstance(target, type) and issubclass(target, EarlyStopping):
        return spec.get("patience") is not None
    return True


def build_callbacks(section: DictConfig | None, model: Any) -> dict[str, Any]:
    """The section's callbacks that can act on ``model``'s run, built, by config name."""
    built: dict[str, Any] = {}
    for name, entry in (section or {}).items():
        spec = OmegaConf.to_container(entry, resolve=True) if OmegaConf.is_dict(entry) else {}
        if "_target_" in spec and spec.pop(BUILD_SWITCH, True) and acts(spec, model):
            built[str(name)] = instantiate(spec, _convert_="all")
    return built


def guards_line(names: Collection[str]) -> str:
    """The console line naming the guards built, e.g. ``guards: graceful stop, nonfinite``."""
    return "guards: " + (", ".join(on for name, on in GUARDS.items() if name in names) or "none")
