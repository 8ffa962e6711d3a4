"""The callbacks a run builds: only those that can act on it, decided once before any is built.

Lightning calls every per-batch hook of every callback at every step, each inside a profiler
context (``_call_callback_hooks`` in lightning/pytorch/trainer/call.py), whether the hook does
anything or not. So a guard that cannot act on this run is not built at all: an entry with
``enabled: false`` (the laptop guards follow ``hardware.guards``, on in the Apple profiles), a
session budget without a limit, and the OOM backoff for a module that does not back-propagate in
chunks (it has nothing to halve). The per-batch hooks a built callback leaves as Lightning's own
no-op are taken off the dispatch too (:func:`without_lightning_no_ops`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

import lightning.pytorch as pl
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from laptrain.callbacks.contracts import BackPropagatesInChunks
from laptrain.callbacks.oom_backoff import OOMBackoff
from laptrain.callbacks.session_budget import SessionBudget

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

PER_BATCH_HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_train_batch_end",
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
)


def acts(spec: Mapping[str, Any], model: Any) -> bool:
    """Whether the callback ``spec`` (a resolved conf/callbacks entry) can act on ``model``'s run."""
    if not spec.get("enabled", True):
        return False
    target = get_object(spec["_target_"])
    if isinstance(target, type) and issubclass(target, SessionBudget):
        return spec.get("max_minutes") is not None or spec.get("max_epochs") is not None
    if isinstance(target, type) and issubclass(target, OOMBackoff):
        return isinstance(model, BackPropagatesInChunks)
    return True


def build_callbacks(section: DictConfig | None, model: Any) -> dict[str, Any]:
    """The section's callbacks that can act on ``model``'s run, built, by their config name
    (``enabled`` decides whether an entry is built; it is not passed on)."""
    built: dict[str, Any] = {}
    for name, entry in (section or {}).items():
        if not (isinstance(entry, DictConfig) and "_target_" in entry):
            continue
        spec = OmegaConf.to_container(entry, resolve=True)
        if acts(spec, model):
            spec.pop("enabled", None)
            built[str(name)] = instantiate(spec, _convert_="all")
    return built


def guards_line(names: Collection[str]) -> str:
    """The console line naming the guards built (config names), e.g. ``guards: graceful stop,
    nonfinite, memory``, in the order of :data:`GUARDS`."""
    return "guards: " + (", ".join(on for name, on in GUARDS.items() if name in names) or "none")


def without_lightning_no_ops(callbacks: Iterable[Any]) -> None:
    """Take off Lightning's dispatch the per-batch hooks a callback's class leaves as Lightning's
    no-op (this instance only): its dispatcher skips an attribute that is not callable, so each
    costs one ``getattr`` instead of a profiler context a step (9 calls a step instead of 60 for a
    user's module on CPU)."""
    for callback in callbacks:
        for name in PER_BATCH_HOOKS:
            if getattr(type(callback), name, None) is getattr(pl.Callback, name):
                setattr(callback, name, None)
