"""Per-batch hooks that cannot act are taken off Lightning's dispatch (laptrain.callbacks.idle_hooks):
the ones a callback leaves as Lightning's no-op, and those of a guard that is off. Every hook that
does something still runs at every step."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from laptrain.callbacks.idle_hooks import PER_BATCH_HOOKS, skip_hooks, skip_idle_hooks
from laptrain.callbacks.memory_monitor import MemoryMonitor
from laptrain.callbacks.oom_backoff import OOMBackoff
from laptrain.callbacks.power_guard import PowerGuard
from laptrain.callbacks.session_budget import SessionBudget
from laptrain.callbacks.thermal_guard import ThermalGuard


class CountsBatchEnds(pl.Callback):
    def __init__(self) -> None:
        self.ends = 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.ends += 1


def _fit(callbacks: list[pl.Callback], steps: int = 4) -> pl.Trainer:
    torch.manual_seed(0)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=steps,
        limit_val_batches=0,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    skip_idle_hooks(trainer.callbacks)
    trainer.fit(BoringModel())
    return trainer


def test_lightning_no_ops_are_skipped_and_overridden_hooks_still_run_every_step():
    counter = CountsBatchEnds()
    _fit([counter], steps=4)
    assert counter.ends == 4  # the one hook it overrides ran at every step
    for name in PER_BATCH_HOOKS:
        if name != "on_train_batch_end":
            assert getattr(counter, name) is None, name  # Lightning's no-op, off the dispatch
    assert callable(counter.on_train_batch_end)
    assert callable(CountsBatchEnds().on_train_batch_start)  # the class itself is untouched


def test_only_per_batch_hooks_can_be_skipped():
    with pytest.raises(ValueError, match="on_save_checkpoint is not a per-batch hook"):
        skip_hooks(CountsBatchEnds(), ["on_save_checkpoint"])


def test_guards_that_are_off_leave_the_dispatch_and_guards_that_are_on_stay():
    off = [
        ThermalGuard(enabled=False),
        MemoryMonitor(enabled=False),
        PowerGuard(enabled=False),
        SessionBudget(),  # no time limit
        OOMBackoff(),  # BoringModel does not back-propagate in chunks: the backoff cannot apply
    ]
    counter = CountsBatchEnds()
    _fit([*off, counter])
    assert counter.ends == 4
    for guard in off:
        assert guard.on_train_batch_end is None, type(guard).__name__
    assert off[0].on_train_batch_start is None and off[2].on_train_batch_start is None
    on = SessionBudget(max_minutes=60)
    _fit([on])
    assert callable(on.on_train_batch_end)  # a time limit is checked after every batch
