"""Test-only callbacks for runs through train.py: a signal or a NaN at a chosen step."""

from __future__ import annotations

import os
import signal

import lightning.pytorch as pl
import torch


class SignalAt(pl.Callback):
    """Send ``signum`` (a name: SIGINT, SIGTERM) during the batch that makes optimizer step
    ``step`` (counted from 1), i.e. at ``on_train_batch_start`` of that batch; ``batch`` > 0
    instead counts micro-batches of the epoch (mid-accumulation stops)."""

    def __init__(self, step: int = 0, signum: str = "SIGTERM", batch: int = 0) -> None:
        self.step, self.signum, self.batch = step, signal.Signals[signum], batch
        self.sent = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        due = batch_idx + 1 == self.batch if self.batch else trainer.global_step + 1 == self.step
        if due and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)


class NaNAt(pl.Callback):
    """Make the loss of the batch that makes optimizer step ``step`` NaN (a diverged run)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_start(self, trainer, pl_module) -> None:
        original = pl_module.training_step

        def training_step(*args, **kwargs):
            loss = original(*args, **kwargs)
            if trainer.global_step + 1 == self.step:
                loss = loss * torch.tensor(float("nan"))
            return loss

        pl_module.training_step = training_step
