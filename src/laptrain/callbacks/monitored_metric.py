"""Stop at the first validation when the module logs no metric the checkpoints rank by.

Which metrics a module logs is known only once it has run a validation. Lightning's
``ModelCheckpoint`` then raises a ``MisconfigurationException`` with a traceback
(lightning/pytorch/callbacks/model_checkpoint.py, ``_validate_monitor_key``). This callback looks
first: Lightning runs checkpoint callbacks after every other one
(``_CallbackConnector._reorder_callbacks``), so it stops the run before any checkpoint is written,
with one line naming the metrics the module does log and ``model._metric_``, the key that picks the
monitored one (conf/train.yaml ``optimized_metric``, conf/callbacks/model_checkpoint.yaml).
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from laptrain.config.check import ConfigError


class MonitoredMetricCheck(Callback):
    """Raise :class:`ConfigError` at the end of the first validation (not the sanity check) when a
    checkpoint callback monitors a metric the module did not log.

    Args:
        preset: the model preset's name (``model=<preset>``), named in the fix.
        metric_set: whether the preset has a ``_metric_`` already (the override then takes no +).
    """

    def __init__(self, preset: str = "<preset>", metric_set: bool = False) -> None:
        self.preset, self.metric_set, self.checked = preset, metric_set, False

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.checked or trainer.sanity_checking:
            return
        self.checked = True
        logged = sorted(trainer.callback_metrics)
        for callback in trainer.checkpoint_callbacks:
            monitor = getattr(callback, "monitor", None)
            if monitor and monitor not in trainer.callback_metrics:
                raise ConfigError(self.message(monitor, type(pl_module).__name__, logged))

    def message(self, monitor: str, module: str, logged: list[str]) -> str:
        """One line: what is monitored, what the module logs, and the two ways to fix it."""
        shown = ", ".join(logged) if logged else "nothing (no self.log call ran)"
        example = next((m for m in logged if m.startswith("val")), "val/loss")
        mode = "min" if "loss" in example else "max"
        plus = "" if self.metric_set else "+"
        return (
            f"the checkpoints rank by {monitor}, which {module} does not log (it logs: {shown}): "
            f"log it in validation_step with self.log('{monitor}', value), or name a logged one "
            f"in conf/model/{self.preset}.yaml as _metric_: {{name: {example}, mode: {mode}}} "
            f"(on the command line: {plus}model._metric_.name={example} "
            f"{plus}model._metric_.mode={mode})"
        )
