"""Lightning's Rich progress bar, counting epochs the way a reader does, drawn at most
``refresh_rate`` times a second.

``RichProgressBar`` labels the first of 3 epochs "Epoch 0/2" (``_get_train_description``,
lightning/pytorch/callbacks/progress/rich_progress.py) and syncs every metric at every batch end
(0.2 ms a step for a tiny MLP on 2 cores: benchmarks/overhead.py).
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import RichProgressBar
from typing_extensions import override


class EpochProgressBar(RichProgressBar):
    """``RichProgressBar`` with a 1-based "Epoch n/total", drawn at most ``refresh_rate``/s."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._drawn_at = float("-inf")
        self._pending: tuple[Any, ...] | None = None

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        now = time.monotonic()
        if self.train_progress_bar_id is not None and now - self._drawn_at < 1 / max(
            self.refresh_rate, 1e-9
        ):
            self._pending = (trainer, pl_module, *args)
            return
        self._drawn_at, self._pending = now, None
        super().on_train_batch_end(trainer, pl_module, *args)

    def _draw_pending(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            super().on_train_batch_end(*pending)
            self._drawn_at = time.monotonic()

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._draw_pending()
        super().on_train_epoch_end(trainer, pl_module)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._draw_pending()
        super().on_validation_start(trainer, pl_module)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._draw_pending()
        super().on_train_end(trainer, pl_module)

    @override
    def _get_train_description(self, current_epoch: int) -> str:
        total = self.trainer.max_epochs
        text = f"Epoch {current_epoch + 1}" + (f"/{total}" if total and total > 0 else "")
        # as Lightning does: as wide as "Validation" so the bar does not jump between the two
        return f"{text:{len(self.validation_description)}}"
