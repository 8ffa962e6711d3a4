"""Put the train loader back where the interrupted run left it, also when Lightning skipped that.

Gap filled: Lightning restores a stateful train loader's position in ``FitLoop.setup_data``
(``_load_combined_loader_states``, lightning/pytorch/loops/fit_loop.py:272 in 2.6.6), but only while
the loop is restarting. ``trainer.estimated_stepping_batches`` (read by every model whose learning
rate schedule spans the run, in ``configure_optimizers``) calls ``setup_data`` earlier, before the
checkpoint's loop state is loaded (trainer.py:1773; the restore is at :1070). The loader is then
built without its position, ``setup_data`` is not run again, and the resumed run replays the
interrupted epoch from its first batch in a new order: measured through ``train.py``, every weight
differed from an uninterrupted run's. This callback loads the position that is still pending when
training starts, before the first batch is drawn (the loader's iterator is lazy).

Second gap of the same flag: ``FitLoop.on_advance_end`` steps the ``interval: epoch`` schedulers
only ``if not self.restarting`` (fit_loop.py:488), and after a mid-epoch resume the loop is
restarting until that epoch has ended (``on_iteration_done``, loop.py:109-110). The resumed epoch's
scheduler step was skipped: a ReduceLROnPlateau on ``val/loss`` (lightning-hydra-template's)
ended one step behind a run never stopped. At the end of that epoch, after its last batch, the
loop is told it is no longer restarting, as it is told right after anyway, so the schedulers step
as they do in a run never stopped.
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
    """Whether a pending train-loader state was loaded now."""
    loop = trainer.fit_loop
    pending = getattr(loop, "_combined_loader_states_to_load", None)
    if not pending or not loop.restarting or loop._combined_loader is None:
        return False
    loop._load_combined_loader_states()
    return True
