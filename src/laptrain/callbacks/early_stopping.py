"""Lightning's EarlyStopping that says where its best score was and keeps a run it stopped stopped.

Gaps filled (lightning/pytorch/callbacks/early_stopping.py in 2.6.6): it checks after every
validation only (a mid-epoch stop counts no stale score twice), ``patience`` is this run's, and a
resumed run it had stopped ends at once (Lightning saves the decision but never acts on it).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import EarlyStopping as LightningEarlyStopping
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason


class EarlyStopping(LightningEarlyStopping):
    """``lightning.pytorch.callbacks.EarlyStopping``, checked after every validation; the module
    docstring says what else differs. Keyword arguments are Lightning's (``patience``,
    ``min_delta``, ``stopping_threshold``, ``divergence_threshold``, ``check_finite``...); the run
    builds it only once ``patience`` is set (callbacks/acting.py)."""

    report_section = "early_stopping"

    def __init__(self, monitor: str, mode: str = "max", **kwargs: Any) -> None:
        kwargs["check_on_train_epoch_end"] = False
        super().__init__(monitor=monitor, mode=mode, **kwargs)
        self.best_epoch: int | None = None
        self._trainer: pl.Trainer | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._trainer = trainer

    @property
    def stopped(self) -> bool:
        return self.stopping_reason != EarlyStoppingReason.NOT_STOPPED

    def _run_early_stopping_check(self, trainer: pl.Trainer) -> None:
        best = self.best_score.clone()
        super()._run_early_stopping_check(trainer)
        if not torch.equal(best, self.best_score):
            self.best_epoch = trainer.current_epoch

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "best_epoch": self.best_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        patience = self.patience
        super().load_state_dict(state_dict)
        self.patience, self.best_epoch = patience, state_dict.get("best_epoch")
        if self.stopped and self._trainer is not None:
            self._trainer.should_stop = True

    @property
    def ended_early(self) -> str | None:
        """'stopped early at epoch N (best <metric> <score> at epoch M)', or None."""
        if not self.stopped:
            return None
        best = f"best {self.monitor} {float(self.best_score):.4g}"
        at = f" at epoch {self.best_epoch + 1}" if self.best_epoch is not None else ""
        return f"stopped early at epoch {self.stopped_epoch + 1} ({best}{at})"

    def summary(self) -> dict[str, Any]:
        """The report's ``early_stopping`` section."""
        return {
            "monitor": self.monitor,
            "patience": self.patience,
            "wait_count": self.wait_count,
            "best_score": float(self.best_score),
            "best_epoch": None if self.best_epoch is None else self.best_epoch + 1,
            "stopped": self.ended_early,
        }
