"""Put the train loader back where the interrupted run left it, also when Lightning skipped that.

``trainer.estimated_stepping_batches`` builds the loader before the loop state is loaded, and
``interval: epoch`` schedulers step only ``if not self.restarting`` (fit_loop.py:488): docs/
lightning.md ("Loader position lost after estimated_stepping_batches").
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback


class LoaderPosition(Callback):
    """Load the train loader's saved position if Lightning left it pending (see module doc)."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        restore_pending_loader_state(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loop = trainer.fit_loop
        if loop.restarting and loop.epoch_loop._num_ready_batches_reached():
            loop._restarting = False  # its own flag only: what on_iteration_done does next


def restore_pending_loader_state(trainer: pl.Trainer) -> bool:
    loop = trainer.fit_loop
    pending = getattr(loop, "_combined_loader_states_to_load", None)
    if not pending or not loop.restarting or loop._combined_loader is None:
        return False
    loop._load_combined_loader_states()
    return True
