"""Lightning's ModelCheckpoint, quiet while laptrain stops a run on purpose.

Gap filled: when a callback sets ``trainer.should_stop`` in the middle of an epoch, Lightning ends the
epoch and ModelCheckpoint saves there as at any epoch end (``on_train_epoch_end``, then ``last.ckpt``
again in ``on_train_end``; lightning/pytorch/callbacks/model_checkpoint.py:488 and :535 in 2.6.6).
For a Ctrl-C, a SIGTERM, a session budget or a swap stop that adds a ``best-step<N>.ckpt`` ranked by
a stale validation score, which an uninterrupted run never writes and whose presence changes which
checkpoint the run tests at the end. During such a stop this subclass saves nothing; the stopping
callback has already saved ``last.ckpt`` at the batch boundary (laptrain/checkpoints/stop.py).
Every other behaviour, option and state key is Lightning's.
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

    def _should_skip_saving_checkpoint(self, trainer: pl.Trainer) -> bool:
        return stopping_on_purpose(trainer) or super()._should_skip_saving_checkpoint(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not stopping_on_purpose(trainer):
            super().on_train_end(trainer, pl_module)
