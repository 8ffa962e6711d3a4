"""Lightning's Rich progress bar, counting epochs the way a reader does.

Gap filled: ``RichProgressBar`` labels the first of 3 epochs "Epoch 0/2" (0-based index over the
last index, lightning/pytorch/callbacks/progress/rich_progress.py ``_get_train_description``).
This one says "Epoch 1/3"; without an epoch limit (``max_epochs=-1``) it says "Epoch 1".
"""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar
from typing_extensions import override


class EpochProgressBar(RichProgressBar):
    """``RichProgressBar`` with a 1-based "Epoch n/total" label; the arguments are its own."""

    @override
    def _get_train_description(self, current_epoch: int) -> str:
        total = self.trainer.max_epochs
        text = f"Epoch {current_epoch + 1}" + (f"/{total}" if total and total > 0 else "")
        # as Lightning does: as wide as "Validation" so the bar does not jump between the two
        return f"{text:{len(self.validation_description)}}"
