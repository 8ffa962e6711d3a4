"""The stop every guard asks for, and every save of ``last.ckpt`` during a fit, owned by one
:class:`Stops` per trainer. A guard makes one call, :func:`request_stop`: the fit ends at a batch
boundary a resume starts from exactly, with ``last.ckpt`` saved there.

``trainer.should_stop = True`` alone is not that (docs/lightning.md, "A stop sets should_stop:
what Lightning does next", has Lightning 2.6.6's lines and the measurements): the stop saves into a
side file that :class:`Stops` moves over ``last.ckpt`` after every ModelCheckpoint's
``on_train_end`` (then every rank waits at a barrier); :func:`end_fit_now` turns off the
validation a mid-epoch stop would run; a stop before a due validation or mid-accumulation waits
for the next clean boundary; and a save asked for in ``on_train_batch_end`` waits until every
callback ran it (:func:`queue_save`; TRM's EMA would be saved one update behind).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, Protocol

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from laptrain.checkpoints.checkpoint_io import move_into_place

PER_BATCH_HOOKS = tuple(  # on_train_batch_start ... on_before_zero_grad ... on_test_batch_end
    name
    for name in vars(Callback)
    if name.endswith(("batch_start", "batch_end", "backward", "optimizer_step", "zero_grad"))
)


def without_lightning_no_ops(callbacks: Iterable[Any]) -> None:
    """Set to None (this instance only) the per-batch hooks its class leaves as Lightning's no-op,
    which the dispatcher then skips (``_call_callback_hooks``, lightning/pytorch/trainer/call.py,
    calls every callback's hooks): 9 hook calls a step instead of 60 for a user's module on CPU."""
    for callback in callbacks:
        for name in PER_BATCH_HOOKS:
            if getattr(type(callback), name, None) is getattr(Callback, name):
                setattr(callback, name, None)


class QueuedSave(Protocol):
    """A checkpoint to write at this batch boundary, after every callback's hook."""

    path: str | None

    def save(self, trainer: pl.Trainer) -> None: ...

    def saved_by_another(self, trainer: pl.Trainer) -> None:
        """An earlier save of this batch wrote ``path`` already (this one is skipped)."""


class Stops(Callback):
    """A trainer's stops and saves of ``last.ckpt``: the queued saves, the deferred stops, the stop's
    side file and the end-of-fit save. One per trainer (:meth:`of`); in ``trainer.callbacks`` only
    from its first use in a fit to the fit's end."""

    _OF: ClassVar[weakref.WeakKeyDictionary[Any, Stops]] = weakref.WeakKeyDictionary()

    def __init__(self, last: Path | None = None) -> None:
        self.last = last  # the job's paths.last_ckpt
        self.queued: list[QueuedSave] = []
        self.deferred: set[str] = set()  # reasons waiting for a clean boundary
        self.ended = False  # end_fit_now stopped this fit
        self.stop_saved: str | None = None  # the side file, until it is put in place
        self.saved_step: int | None = None
        without_lightning_no_ops([self])  # joins trainer.callbacks after job/run.py's pass

    @classmethod
    def of(cls, trainer: Any) -> Stops:
        if trainer not in cls._OF:
            cls._OF[trainer] = cls()
        return cls._OF[trainer]

    def joined(self, trainer: pl.Trainer) -> Stops:
        """This object, at the end of ``trainer.callbacks`` (Lightning's hook loop iterates that
        list, so joining in a batch's hook still runs this batch's ``on_train_batch_end``)."""
        if not any(cb is self for cb in trainer.callbacks):
            trainer.callbacks.append(self)
        return self

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        for reason in sorted(self.deferred):
            request_stop(trainer, reason)
        done: set[str | None] = set()
        queued, self.queued = self.queued, []
        for save in queued:
            if save.path not in done:
                save.save(trainer)
                done.add(save.path)
            else:  # e.g. a checkpoint on request in the batch where another callback stops the run
                save.saved_by_another(trainer)

    def on_save_checkpoint(self, trainer: pl.Trainer, *args: Any) -> None:
        # every ModelCheckpoint of a run keeps save_last=True: any save means last.ckpt is current
        self.saved_step = trainer.global_step

    def save_last_unless_current(self, trainer: pl.Trainer) -> None:
        """At the end of fit, ``last.ckpt`` unless a save at this step already wrote it. Rank 0's
        view decides for all: saving is a collective (a barrier), and another node may not see the
        file rank 0 wrote."""
        path = last_checkpoint_of(trainer)
        if path is None:
            return
        current = self.saved_step == trainer.global_step and path.exists()
        if not trainer.strategy.broadcast(current):
            trainer.save_checkpoint(str(path), weights_only=False)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.stop_saved is None:
            return
        path = last_checkpoint_of(trainer)
        if trainer.is_global_zero and path is not None:
            move_into_place(self.stop_saved, path)
        trainer.strategy.barrier("stop checkpoint in place")  # the other ranks exit after it
        self.stop_saved = None

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._leave(trainer)

    def on_exception(self, trainer: pl.Trainer, *args: Any) -> None:
        self._leave(trainer)

    def _leave(self, trainer: pl.Trainer) -> None:
        """Out of ``trainer.callbacks``; a next fit of ``trainer`` starts with a fresh one."""
        trainer.callbacks[:] = [cb for cb in trainer.callbacks if cb is not self]
        Stops._OF[trainer] = Stops(self.last)


def use_last_checkpoint(trainer: pl.Trainer, path: str | Path | None) -> None:
    """Make ``path`` (the job's ``paths.last_ckpt``) where ``trainer``'s stops and saves write."""
    Stops.of(trainer).last = Path(path) if path else None


def last_checkpoint_of(trainer: Any) -> Path | None:
    """``trainer``'s ``last.ckpt``: the job's, else where its first ModelCheckpoint with
    ``save_last`` writes it (a Trainer the job did not build), else None (no saves)."""
    try:
        own = Stops._OF.get(trainer)
    except TypeError:  # a stand-in trainer (no weak reference): it has no stops of its own
        own = None
    if own is not None and own.last is not None:
        return own.last
    for cb in getattr(trainer, "callbacks", ()):
        if isinstance(cb, ModelCheckpoint) and cb.save_last and cb.dirpath:
            return Path(cb.dirpath) / f"{cb.CHECKPOINT_NAME_LAST}{cb.FILE_EXTENSION}"
    return None


def queue_save(trainer: pl.Trainer, save: QueuedSave) -> None:
    """Have ``save`` written at the end of this batch's hooks, after every callback's."""
    Stops.of(trainer).joined(trainer).queued.append(save)


def save_last(trainer: pl.Trainer) -> None:
    """Write the run's ``last.ckpt`` now (a collective: every rank calls it); nothing without one."""
    path = last_checkpoint_of(trainer)
    if path is not None:
        trainer.save_checkpoint(str(path), weights_only=False)


class _StopSave:
    """The stop's checkpoint, saved beside ``last.ckpt`` and moved over it at the end of fit."""

    def __init__(self, path: Path | None) -> None:
        self.path = str(path) if path is not None else None

    def save(self, trainer: pl.Trainer) -> None:
        if self.path:
            trainer.save_checkpoint(f"{self.path}.stop", weights_only=False)
            Stops.of(trainer).stop_saved = f"{self.path}.stop"

    def saved_by_another(self, trainer: pl.Trainer) -> None:
        """Nothing to put in place: the other save wrote ``path``'s state of this very batch."""


def request_stop(trainer: pl.Trainer, reason: str) -> bool:
    """Save ``last.ckpt`` and end fit at this batch boundary, with no validation pass and no
    ranking; False when a validation or the rest of an accumulation follows this batch: the stop
    for ``reason`` then happens at the next clean boundary, with nothing more to call."""
    stops = Stops.of(trainer).joined(trainer)
    if not at_clean_boundary(trainer):
        stops.deferred.add(reason)
        return False
    stops.deferred.discard(reason)
    end_fit_now(trainer)
    queue_save(trainer, _StopSave(last_checkpoint_of(trainer)))
    return True


def end_fit_now(trainer: pl.Trainer) -> None:
    """Stop at this batch boundary without the validation Lightning adds to a mid-epoch stop."""
    trainer.limit_val_batches = 0
    trainer.should_stop = True
    Stops.of(trainer).ended = True


def ended_at_batch_boundary(trainer: pl.Trainer) -> bool:
    return Stops.of(trainer).ended


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
