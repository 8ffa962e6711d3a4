"""Two stand-in DDP ranks for the guards' collectives, without torch.distributed.

Under DDP a collective (``strategy.broadcast``, the barrier that ends ``Trainer.save_checkpoint``)
returns only once every rank has called it: a rank that skips one leaves the others waiting for
ever. Here the two ranks run one after the other through the same hook calls. Rank 0's broadcasts
are recorded; rank 1's n-th broadcast receives rank 0's n-th value, as
``broadcast_object_list(src=0)`` would hand it over (or its own value when rank 0 made no n-th
call: under DDP that rank would hang there). Each rank records ``(global_step, kind)`` for every
collective, so a test asserts that both ranks made the same ones at the same steps.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from lightning.pytorch import Callback

from laptrain.checkpoints.stop import use_last_checkpoint

Collective = tuple[int, str]


class Wire:
    """What rank 0 broadcast, in order."""

    def __init__(self) -> None:
        self.sent: list[Any] = []


class RankStrategy:
    """The collectives of a strategy, recorded per call."""

    def __init__(self, rank: int, wire: Wire, trainer: RankTrainer) -> None:
        self.rank, self.wire, self.trainer = rank, wire, trainer
        self.calls: list[Collective] = []
        self._received = 0

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        self.calls.append((self.trainer.global_step, "broadcast"))
        if self.rank == 0:
            self.wire.sent.append(obj)
            return obj
        n, self._received = self._received, self._received + 1
        return self.wire.sent[n] if n < len(self.wire.sent) else obj

    def barrier(self, name: str | None = None) -> None:
        self.calls.append((self.trainer.global_step, "barrier"))


class RankTrainer:
    """What the guards read of a Trainer, for one rank of two; no validation, no data fetcher
    (so a stop happens at once, ``laptrain.checkpoints.stop.at_clean_boundary``)."""

    def __init__(self, rank: int, wire: Wire, callbacks: Sequence[Callback] = ()) -> None:
        self.global_rank, self.world_size, self.is_global_zero = rank, 2, rank == 0
        self.global_step, self.current_epoch, self.log_every_n_steps = 0, 0, 1
        self.max_epochs, self.max_steps, self.num_training_batches = 1000, -1, 10**6
        self.should_stop, self.limit_val_batches, self.enable_validation = False, 1.0, False
        self.loggers: list[Any] = []
        self.callbacks = list(callbacks)
        self.fit_loop = SimpleNamespace(_data_fetcher=None)
        self.strategy = RankStrategy(rank, wire, self)
        use_last_checkpoint(self, "unused/last.ckpt")  # as the job does; nothing is written

    def save_checkpoint(self, filepath: str, weights_only: bool = False) -> None:
        """Lightning's ends in ``strategy.barrier`` (lightning/pytorch/trainer/trainer.py:1465)."""
        self.strategy.barrier("Trainer.save_checkpoint")


def run_rank(
    trainer: RankTrainer,
    batches: int,
    before_batch_end: Callable[[RankTrainer], None] | None = None,
) -> None:
    """The training hooks of ``batches`` batches, one optimizer step each, until a stop.

    ``before_batch_end`` runs after the step and before the callbacks' ``on_train_batch_end``
    (a callback earlier in the list, say)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # every rank is rank 0 to rank_zero_warn
        for cb in trainer.callbacks:
            cb.on_train_start(trainer, None)
        for batch_idx in range(batches):
            if trainer.should_stop:
                break
            for cb in trainer.callbacks:
                cb.on_train_batch_start(trainer, None, None, batch_idx)
            trainer.global_step += 1
            if before_batch_end is not None:
                before_batch_end(trainer)
            for cb in trainer.callbacks:
                cb.on_train_batch_end(trainer, None, None, None, batch_idx)


def end_fit(trainer: RankTrainer) -> None:
    """The callbacks' ``on_train_end`` then ``on_fit_end``, as Lightning calls them after a fit."""
    for hook in ("on_train_end", "on_fit_end"):
        for cb in list(trainer.callbacks):
            getattr(cb, hook)(trainer, None)


def two_ranks(
    make: Callable[[int], Callback],
    batches: int,
    before_batch_end: Callable[[RankTrainer], None] | None = None,
) -> tuple[list[RankTrainer], list[Callback]]:
    """Rank 0, then rank 1, each with the callback ``make(rank)`` builds, over the same batches."""
    wire = Wire()
    callbacks = [make(rank) for rank in (0, 1)]
    trainers = [RankTrainer(rank, wire, [cb]) for rank, cb in enumerate(callbacks)]
    for trainer in trainers:
        run_rank(trainer, batches, before_batch_end)
    return trainers, callbacks
