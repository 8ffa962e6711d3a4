"""The checkpoint of a run that a callback stops in the middle of an epoch.

After ``trainer.should_stop`` is set mid-epoch, Lightning ends the epoch loop and counts the epoch as
done, and ``ModelCheckpoint(save_last=True).on_train_end`` (lightning 2.6) then rewrites
``last.ckpt`` whenever that instance has not written it in this process (the 250-step periodic one,
say), with the epoch already counted. Resuming from that file skips the rest of the epoch. So the
stopping callback saves at the batch boundary into a side file, and ``put_in_place`` moves it over
the run's ``last.ckpt`` in ``on_fit_end``, which Lightning calls after every ``on_train_end``.
"""

from __future__ import annotations

import os

import lightning.pytorch as pl


class StopCheckpoint:
    """Save at the stop, put in place at the end of fit; ``path`` None = do nothing."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._pending = False

    @property
    def side_path(self) -> str:
        return f"{self.path}.stop"

    def save(self, trainer: pl.Trainer) -> None:
        if self.path:
            trainer.save_checkpoint(self.side_path)
            self._pending = True

    def put_in_place(self, trainer: pl.Trainer) -> None:
        if self._pending and trainer.is_global_zero:
            os.replace(self.side_path, self.path)
        self._pending = False
