"""Lightning's ModelCheckpoint, quiet while laptrain stops a run on purpose.

A mid-epoch ``should_stop`` makes ModelCheckpoint save a ``best-step<N>.ckpt`` ranked by a stale
score (model_checkpoint.py:488 and :535 in 2.6.6); during such a stop this saves nothing.
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint

from laptrain.checkpoints.stop import ended_at_batch_boundary


def stopping_on_purpose(trainer: pl.Trainer) -> bool:
    """A laptrain callback is ending the run at a batch boundary (signal, session budget, swap...)."""
    return bool(trainer.should_stop) and ended_at_batch_boundary(trainer)


class ModelCheckpoint(LightningModelCheckpoint):
    """``lightning.pytorch.callbacks.ModelCheckpoint`` that skips saving during a laptrain stop."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # not in __init__: the config check binds the yaml's keys to Lightning's own signature
        super().setup(trainer, pl_module, stage)
        if self._every_n_train_steps < 1 and self._train_time_interval is None:
            self.on_train_batch_end = None  # type: ignore[assignment]  # a no-op: not dispatched

    def _should_skip_saving_checkpoint(self, trainer: pl.Trainer) -> bool:
        return stopping_on_purpose(trainer) or super()._should_skip_saving_checkpoint(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not stopping_on_purpose(trainer):
            super().on_train_end(trainer, pl_module)
