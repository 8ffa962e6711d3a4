"""The checkpoint of a run that a callback stops in the middle of an epoch, and the stop itself.

After ``trainer.should_stop`` is set mid-epoch, Lightning ends the epoch loop and counts the epoch as
done, and ``ModelCheckpoint(save_last=True).on_train_end`` (lightning 2.6) then rewrites
``last.ckpt`` whenever that instance has not written it in this process (the 250-step periodic one,
say), with the epoch already counted. Resuming from that file skips the rest of the epoch. So the
stopping callback saves at the batch boundary into a side file, and ``put_in_place`` moves it over
the run's ``last.ckpt`` in ``on_fit_end``, which Lightning calls after every ``on_train_end``.

``should_stop`` set mid-epoch also makes Lightning run a validation pass right away
(``_should_check_val_fx``, lightning/pytorch/loops/training_epoch_loop.py:540 in 2.6.6), and
ModelCheckpoint then ranks the stopped weights among the best ones: a pass the uninterrupted run
never makes, a ``best-step<N>.ckpt`` it never writes, and minutes of waiting after a Ctrl-C on a
large validation set. :meth:`StopCheckpoint.stop` turns validation off for the rest of this fit
(``trainer.enable_validation`` is false when ``limit_val_batches`` is 0, trainer.py:1354), and
laptrain's ModelCheckpoint saves nothing while such a stop is under way
(:mod:`laptrain.callbacks.model_checkpoint`).

A stop asked for on a batch that a validation follows (the epoch's last batch, or every
``val_check_interval`` batches) waits: the validation and its checkpoints are part of the
uninterrupted run, and Lightning resumes a checkpoint taken just before them as if they had run
(``FitLoop.reset``, fit_loop.py:397-411: the epoch is counted done, its validation never runs). The
stop then happens at the next batch boundary, one batch later. Likewise in the middle of a gradient
accumulation: the gradients summed so far are not in any checkpoint, so the stop waits for the
optimizer step (at most ``accumulate_grad_batches - 1`` batches).

The stop checkpoint is written after every callback's ``on_train_batch_end`` for that batch (by
laptrain's ModelCheckpoint, which Lightning runs last), not inside the stopping callback's hook:
a callback later in the list (the EMA that TRM adds) would otherwise be saved one update behind,
and measured through ``train.py`` 13 of TRM's 15 tensors then differed after the resume.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol, runtime_checkable

import lightning.pytorch as pl

from laptrain.files import fsync_dir

_ENDED: weakref.WeakSet[pl.Trainer] = weakref.WeakSet()
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


class StopCheckpoint:
    """Save at the stop, put in place at the end of fit; ``path`` None = do nothing."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._pending = False
        self.deferred = False

    @property
    def side_path(self) -> str:
        return f"{self.path}.stop"

    def save(self, trainer: pl.Trainer) -> None:
        if self.path:
            trainer.save_checkpoint(self.side_path, weights_only=False)
            self._pending = True

    def saved_by_another(self, trainer: pl.Trainer) -> None:
        """Nothing to put in place: the other save wrote ``path``'s state of this very batch."""

    def stop(self, trainer: pl.Trainer) -> bool:
        """Save, then end fit at this batch boundary with no validation pass and no ranking;
        False when a validation follows this batch: then :meth:`tick` stops at the next one."""
        if not at_clean_boundary(trainer):
            self.deferred = True
            return False
        self.deferred = False
        end_fit_now(trainer)
        queue_save(trainer, self)
        return True

    def tick(self, trainer: pl.Trainer) -> bool:
        """Call at every ``on_train_batch_end``: carries out a deferred stop; True once stopped."""
        return self.deferred and self.stop(trainer)

    def put_in_place(self, trainer: pl.Trainer) -> None:
        if self._pending and trainer.is_global_zero and self.path:
            os.replace(self.side_path, self.path)  # same folder: atomic on POSIX
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        self._pending = False


def end_fit_now(trainer: pl.Trainer) -> None:
    """Stop at this batch boundary without the validation Lightning adds to a mid-epoch stop."""
    trainer.limit_val_batches = 0
    trainer.should_stop = True
    _ENDED.add(trainer)


def ended_at_batch_boundary(trainer: pl.Trainer) -> bool:
    """Whether :func:`end_fit_now` stopped this trainer's fit."""
    return trainer in _ENDED


def at_clean_boundary(trainer: pl.Trainer) -> bool:
    """Whether a checkpoint taken now (at ``on_train_batch_end``, before anything sets
    ``should_stop``) resumes exactly: no gradient accumulation under way and no validation due
    after this batch. Lightning's own rules (training_epoch_loop.py:529 and :``_should_accumulate``
    in 2.6.6); with another Lightning that lacks them, True (stop now)."""
    loop = trainer.fit_loop
    fetcher = getattr(loop, "_data_fetcher", None)
    if trainer.should_stop or fetcher is None:
        return True
    try:
        if loop.epoch_loop._should_accumulate():
            return False
        return not (trainer.enable_validation and loop.epoch_loop._should_check_val_fx(fetcher))
    except (AttributeError, TypeError):
        return True
