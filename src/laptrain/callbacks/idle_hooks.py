"""Per-batch callback hooks that do nothing, taken off Lightning's dispatch.

Gap it fills: Lightning calls every per-batch hook of every callback at every step, each inside a
profiler context whose name formats the callback's ``state_key`` (``ModelCheckpoint`` builds it
from a dict of its settings), whether the hook does anything or not. With laptrain's 15 default
callbacks that is about 90 calls a step, most of them Lightning's empty ``Callback`` methods or a
guard that is switched off: about 0.1 ms a step, as much as the guards' own work
(docs/benchmarks.md, "What laptrain costs a user's own module per step"). Lightning's dispatcher,
``_call_callback_hooks`` in lightning/pytorch/trainer/call.py, skips an attribute that is not
callable (``if callable(fn)``), so a hook set to None on the instance costs one ``getattr``.

Only per-batch hooks are taken off, and only where the hook cannot act: Lightning's own no-op
(the class does not override it), or a hook its callback says is idle for this run (a guard that
is off). Every other hook, and every callback's state and checkpoint hooks, is left alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lightning.pytorch as pl

PER_BATCH_HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_train_batch_end",
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
)


def skip_hooks(callback: pl.Callback, names: Iterable[str]) -> None:
    """Take ``callback``'s per-batch hooks ``names`` off Lightning's dispatch for good (this
    instance only): a callback calls it when it knows those hooks will do nothing this run."""
    for name in names:
        if name not in PER_BATCH_HOOKS:
            raise ValueError(f"{name} is not a per-batch hook: only those are skipped")
        setattr(callback, name, None)


def skip_idle_hooks(callbacks: Iterable[Any]) -> None:
    """For each callback, skip the per-batch hooks its class leaves as Lightning's no-op."""
    for callback in callbacks:
        idle = [
            name
            for name in PER_BATCH_HOOKS
            if getattr(type(callback), name, None) is getattr(pl.Callback, name)
        ]
        skip_hooks(callback, idle)
