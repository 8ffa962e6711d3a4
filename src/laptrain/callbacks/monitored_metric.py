"""Stop at the first validation when the module logs no metric the checkpoints rank by, early
stopping watches or an Optuna pruner is told.

Lightning's ``ModelCheckpoint`` would raise with a traceback (``_validate_monitor_key``,
lightning/pytorch/callbacks/model_checkpoint.py; it runs last, ``_reorder_callbacks``); this must
come before EarlyStopping, which raises in the same hook (``_validate_condition_metric``).
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from laptrain.callbacks.early_stopping import EarlyStopping
from laptrain.callbacks.trial_pruning import TrialPruning
from laptrain.config.check import ConfigError


class MonitoredMetricCheck(Callback):
    """Raise :class:`ConfigError` at the end of the first validation when a checkpoint callback
    monitors a metric the module did not log; ``preset`` (``model=<preset>``) and ``metric_set``
    (the preset has a ``_metric_``: the override takes no +) shape the fix."""

    def __init__(self, preset: str = "<preset>", metric_set: bool = False) -> None:
        self.preset, self.metric_set, self.checked = preset, metric_set, False

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.checked or trainer.sanity_checking:
            return
        self.checked = True
        logged = sorted(trainer.callback_metrics)
        for watcher, monitor, option in _watched(trainer):
            if monitor and monitor not in trainer.callback_metrics:
                raise ConfigError(
                    self.message(monitor, type(pl_module).__name__, logged, watcher, option)
                )

    def message(
        self,
        monitor: str,
        module: str,
        logged: list[str],
        watcher: str = "the checkpoints rank by",
        option: str | None = None,
    ) -> str:
        """One line: what is monitored, what the module logs, and the two ways to fix it (the
        model's ``_metric_``, or the ``option`` that names the watched metric apart from it)."""
        shown = ", ".join(logged) if logged else "nothing (no self.log call ran)"
        example = next((m for m in logged if m.startswith("val")), "val/loss")
        mode = "min" if "loss" in example else "max"
        plus = "" if self.metric_set else "+"
        head = (
            f"{watcher} {monitor}, which {module} does not log (it logs: {shown}): "
            f"log it in validation_step with self.log('{monitor}', value), or "
        )
        if option:
            return head + f"watch a logged one: {option}={example}"
        return head + (
            f"name a logged one in conf/model/{self.preset}.yaml as _metric_: "
            f"{{name: {example}, mode: {mode}}} (on the command line: "
            f"{plus}model._metric_.name={example} {plus}model._metric_.mode={mode})"
        )


def _watched(trainer: pl.Trainer) -> list[tuple[str, str | None, str | None]]:
    """(who watches, the metric, the option naming it when that is not ``optimized_metric``) for
    the checkpoints, an enabled early stopping and a trial pruner."""
    optimized = getattr(trainer.checkpoint_callback, "monitor", None)
    watched = [
        ("the checkpoints rank by", getattr(cb, "monitor", None), None)
        for cb in trainer.checkpoint_callbacks
    ]
    for cb in trainer.callbacks:
        if isinstance(cb, EarlyStopping):
            option = None if cb.monitor == optimized else "callbacks.early_stopping.monitor"
            watched.append(("early stopping watches", cb.monitor, option))
        elif isinstance(cb, TrialPruning):
            watched.append(("the Optuna pruner is told", cb.monitor, None))
    return watched
