"""Saves of ``last.ckpt`` during a fit: at once, or queued to the end of this batch's hooks.

A save asked for in a callback's ``on_train_batch_end`` (a stop, a checkpoint on request) waits
until every callback has run its hook for that batch: laptrain's ModelCheckpoint, which Lightning
runs last, writes the queue (:class:`SavesQueuedStops`). A callback later in the list (the EMA that
TRM adds) would otherwise be saved one update behind, and measured through ``train.py`` 13 of TRM's
15 tensors then differed after the resume.
"""

from __future__ import annotations

import weakref
from typing import Protocol, runtime_checkable

import lightning.pytorch as pl

from laptrain.checkpoints.last import last_checkpoint_of

_QUEUED: weakref.WeakKeyDictionary[pl.Trainer, list[QueuedSave]] = weakref.WeakKeyDictionary()


class QueuedSave(Protocol):
    """A checkpoint to write at this batch boundary, after every callback's hook."""

    path: str | None

    def save(self, trainer: pl.Trainer) -> None: ...

    def saved_by_another(self, trainer: pl.Trainer) -> None:
        """An earlier save of this batch wrote ``path`` already (this one is skipped)."""


@runtime_checkable
class SavesQueuedStops(Protocol):
    """Runs :func:`save_queued_stops` in its ``on_train_batch_end``, after every other callback's
    (laptrain's ModelCheckpoint: Lightning moves checkpoint callbacks to the end of the list)."""

    def save_queued_stops(self, trainer: pl.Trainer) -> None: ...


def queue_save(trainer: pl.Trainer, save: QueuedSave) -> None:
    """Have ``save`` written by :func:`save_queued_stops` at the end of this batch's hooks (at once
    when no callback of this trainer runs it)."""
    if any(isinstance(cb, SavesQueuedStops) for cb in trainer.callbacks):
        _QUEUED.setdefault(trainer, []).append(save)
    else:
        save.save(trainer)


def save_queued_stops(trainer: pl.Trainer) -> None:
    """Write the checkpoints asked for in this batch (stops, a checkpoint on request), once per
    file: after every callback (an EMA, a report) has counted the batch, so that the resumed run
    starts from the same state."""
    done: set[str | None] = set()
    for stop in _QUEUED.pop(trainer, []):
        if stop.path not in done:
            stop.save(trainer)
            done.add(stop.path)
        else:  # e.g. a checkpoint on request in the batch where another callback stops the run
            stop.saved_by_another(trainer)


def save_last(trainer: pl.Trainer) -> None:
    """Write the run's ``last.ckpt`` now (a collective: every rank calls it); nothing without one."""
    path = last_checkpoint_of(trainer)
    if path is not None:
        trainer.save_checkpoint(str(path), weights_only=False)


def save_last_unless_current(trainer: pl.Trainer, saved_step: int | None) -> None:
    """At the end of fit: :func:`save_last` unless a save at ``saved_step`` (this step) already
    wrote it. Rank 0's view decides for all: saving is a collective (a barrier), and another node
    may not see the file rank 0 wrote."""
    path = last_checkpoint_of(trainer)
    if path is None:
        return
    current = saved_step == trainer.global_step and path.exists()
    if trainer.strategy.broadcast(current):
        return
    trainer.save_checkpoint(str(path), weights_only=False)
