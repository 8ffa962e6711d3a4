"""Train in chunks: stop this process after a time or epoch budget, resume with the same command."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from laptrain.checkpoints.stop import request_stop


class SessionBudget(Callback):
    """Stop at a batch boundary once this process has trained ``max_minutes`` or ``max_epochs``.

    Lightning's ``max_time`` spans resumes (docs/lightning.md, "Timer and max_time"); this one is
    per process ("train 2-3 epochs, then let the machine rest"), exit 75; rank 0's clock decides
    (docs/callbacks.md)."""

    def __init__(
        self,
        max_minutes: float | None = None,
        max_epochs: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_minutes is not None and max_minutes <= 0:
            raise ValueError("session_budget.max_minutes must be > 0, or null for no time limit")
        if max_epochs is not None and max_epochs < 1:
            raise ValueError("session_budget.max_epochs must be >= 1, or null for no epoch limit")
        self.max_minutes, self.max_epochs, self.clock = max_minutes, max_epochs, clock
        self.stop_reason: str | None = None
        self._start, self._first_epoch = 0.0, 0

    @property
    def stopped_for_session(self) -> bool:
        return self.stop_reason == "session"

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start, self._first_epoch = self.clock(), trainer.current_epoch
        self.stop_reason = None

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self.max_minutes is None:
            return
        local = (self.clock() - self._start, trainer.should_stop)
        spent, stopping = trainer.strategy.broadcast(local)  # rank 0's, on every rank
        if stopping:
            return
        # Mid-epoch, or at the next batch when a validation follows this one
        # (laptrain/checkpoints/stop.py).
        if (
            spent >= self.max_minutes * 60
            and not self._ends_anyway(trainer, batch_idx)
            and request_stop(trainer, "session")
        ):
            self._stop(trainer, f"{self.max_minutes:g} min")

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.max_epochs is None or trainer.should_stop:
            return
        done = trainer.current_epoch + 1 - self._first_epoch
        last_epoch = (
            trainer.max_epochs not in (None, -1) and trainer.current_epoch + 1 >= trainer.max_epochs
        )
        if done >= self.max_epochs and not last_epoch and not self._steps_done(trainer):
            self._stop(trainer, f"{self.max_epochs} epoch(s)")

    @staticmethod
    def _steps_done(trainer: pl.Trainer) -> bool:
        return trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps

    def _ends_anyway(self, trainer: pl.Trainer, batch_idx: int) -> bool:
        last_batch = batch_idx + 1 >= trainer.num_training_batches
        last_epoch = (
            trainer.max_epochs not in (None, -1) and trainer.current_epoch + 1 >= trainer.max_epochs
        )
        return self._steps_done(trainer) or (last_batch and last_epoch)

    def _stop(self, trainer: pl.Trainer, budget: str) -> None:
        self.stop_reason = "session"
        trainer.should_stop = True
        rank_zero_info(
            f"session: this session's budget ({budget}) is used at step {trainer.global_step}; "
            "saving a checkpoint. Resume with the same command."
        )
