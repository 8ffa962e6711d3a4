"""The stop every guard asks for: :func:`request_stop` ends the fit at a batch boundary that a
resume starts from exactly, with ``last.ckpt`` saved there.

After ``trainer.should_stop`` is set mid-epoch, Lightning ends the epoch loop and counts the epoch as
done, and ``ModelCheckpoint(save_last=True).on_train_end`` (lightning 2.6) then rewrites
``last.ckpt`` whenever that instance has not written it in this process (the 250-step periodic one,
say), with the epoch already counted. Resuming from that file skips the rest of the epoch. So the
stop saves at the batch boundary into a side file, and :func:`put_stop_in_place` (every stopping
guard's ``on_fit_end``, which Lightning calls after every ``on_train_end``) moves it over the run's
``last.ckpt``.

``should_stop`` set mid-epoch also makes Lightning run a validation pass right away
(``_should_check_val_fx``, lightning/pytorch/loops/training_epoch_loop.py:540 in 2.6.6), and
ModelCheckpoint then ranks the stopped weights among the best ones: a pass the uninterrupted run
never makes, a ``best-step<N>.ckpt`` it never writes, and minutes of waiting after a Ctrl-C on a
large validation set. :func:`end_fit_now` turns validation off for the rest of this fit
(``trainer.enable_validation`` is false when ``limit_val_batches`` is 0, trainer.py:1354), and
laptrain's ModelCheckpoint saves nothing while such a stop is under way
(:func:`ended_at_batch_boundary`).

A stop asked for on a batch that a validation follows (the epoch's last batch, or every
``val_check_interval`` batches) waits: the validation and its checkpoints are part of the
uninterrupted run, and Lightning resumes a checkpoint taken just before them as if they had run
(``FitLoop.reset``, fit_loop.py:397-411: the epoch is counted done, its validation never runs). The
stop then happens at the next batch boundary (:func:`retry_stop`), one batch later. Likewise in the
middle of a gradient accumulation: the gradients summed so far are not in any checkpoint, so the
stop waits for the optimizer step (at most ``accumulate_grad_batches - 1`` batches).

The save itself is queued to the end of the batch's hooks (:mod:`.saves`).
"""

from __future__ import annotations

import weakref

import lightning.pytorch as pl

from laptrain.checkpoints.files import move_into_place
from laptrain.checkpoints.last import last_checkpoint_of
from laptrain.checkpoints.saves import queue_save

_ENDED: weakref.WeakSet[pl.Trainer] = weakref.WeakSet()
_STOPS: weakref.WeakKeyDictionary[pl.Trainer, _StopSave] = weakref.WeakKeyDictionary()


class _StopSave:
    """A trainer's stop checkpoint: saved beside ``last.ckpt``, moved over it at the end of fit."""

    def __init__(self) -> None:
        self.path: str | None = None
        self.pending = False
        self.deferred: set[str] = set()  # reasons waiting for a clean boundary

    @property
    def side_path(self) -> str:
        return f"{self.path}.stop"

    def save(self, trainer: pl.Trainer) -> None:
        if self.path:
            trainer.save_checkpoint(self.side_path, weights_only=False)
            self.pending = True

    def saved_by_another(self, trainer: pl.Trainer) -> None:
        """Nothing to put in place: the other save wrote ``path``'s state of this very batch."""


def _stop_of(trainer: pl.Trainer) -> _StopSave:
    if trainer not in _STOPS:
        _STOPS[trainer] = _StopSave()
    return _STOPS[trainer]


def request_stop(trainer: pl.Trainer, reason: str) -> bool:
    """Save ``last.ckpt`` and end fit at this batch boundary, with no validation pass and no
    ranking; False when a validation or the rest of an accumulation follows this batch: then
    :func:`retry_stop` with the same ``reason`` stops at the next boundary."""
    stop = _stop_of(trainer)
    if not at_clean_boundary(trainer):
        stop.deferred.add(reason)
        return False
    stop.deferred.discard(reason)
    path = last_checkpoint_of(trainer)
    stop.path = str(path) if path is not None else None
    end_fit_now(trainer)
    queue_save(trainer, stop)
    return True


def retry_stop(trainer: pl.Trainer, reason: str | None) -> bool:
    """Call at every ``on_train_batch_end``: carries out a stop for ``reason`` that
    :func:`request_stop` deferred; True once stopped."""
    stop = _STOPS.get(trainer)
    return bool(stop and reason in stop.deferred) and request_stop(trainer, str(reason))


def put_stop_in_place(trainer: pl.Trainer) -> None:
    """In ``on_fit_end``: the stop's side file over ``last.ckpt`` (rank 0), once per fit."""
    stop = _STOPS.get(trainer)
    if stop is None:
        return
    if stop.pending and trainer.is_global_zero and stop.path:
        move_into_place(stop.side_path, stop.path)
    if stop.pending:  # the other ranks exit only once it is in place (rank 0 then requeues)
        trainer.strategy.barrier("stop checkpoint in place")
    stop.pending = False


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
