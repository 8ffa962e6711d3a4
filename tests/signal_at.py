"""Test-only callbacks for runs through train.py: a signal, a checkpoint request, a kill or a NaN
at a chosen step."""

from __future__ import annotations

import os
import signal

import lightning.pytorch as pl
import torch


class SignalAt(pl.Callback):
    """Send ``signum`` (a name: SIGINT, SIGTERM) during the batch that makes optimizer step
    ``step`` (counted from 1), i.e. at ``on_train_batch_start`` of that batch; ``batch`` > 0
    instead counts micro-batches of the epoch (mid-accumulation stops); ``times`` signals back to
    back (a double Ctrl-C)."""

    def __init__(self, step: int = 0, signum: str = "SIGTERM", batch: int = 0, times: int = 1):
        self.step, self.signum, self.batch = step, signal.Signals[signum], batch
        self.times = times
        self.sent = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        due = batch_idx + 1 == self.batch if self.batch else trainer.global_step + 1 == self.step
        if due and not self.sent:
            self.sent = True
            for _ in range(self.times):
                os.kill(os.getpid(), self.signum)


class RequestAt(pl.Callback):
    """Leave the ``laptrain checkpoint`` request in ``run_dir`` during the batch that makes
    optimizer step ``step`` (rank 0 only: the file is rank 0's to read)."""

    def __init__(self, step: int, run_dir: str) -> None:
        self.step, self.run_dir = step, run_dir

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step + 1 == self.step and trainer.is_global_zero:
            from laptrain.run_folder.checkpoint_request import ask

            ask(self.run_dir)


class KillAt(pl.Callback):
    """SIGKILL this process at the start of the batch that makes optimizer step ``step``: a
    crash or a dead battery, where nothing gets to save."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step + 1 == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


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
