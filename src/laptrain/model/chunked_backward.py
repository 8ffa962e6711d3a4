"""Back-propagate a batch in chunks, so that an out-of-memory error is retried, not fatal.

A callback cannot catch an exception inside ``training_step``, so the module back-propagates
itself: index ranges of the batch, each weighted ``len(range) / len(batch) /
accumulate_grad_batches`` through ``trainer.strategy.backward`` (the GradScaler applies); an OOM
splits the failing range, whose gradients went into fresh buffers (no partial gradient is kept).
Usage: ``class MyModule(ChunkedBackward, LightningModule)``, then in ``training_step``
``loss = self.chunked_backward(batch, self.loss_of)``; the policy lives in ``OOMBackoff``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from laptrain.data.collate import batch_length
from laptrain.ranks.processes import wraps_the_module


def slice_batch(batch: Any, start: int, stop: int, length: int | None = None) -> Any:
    """Samples ``start:stop`` of every tensor (and every per-sample list) in the batch."""
    length = batch_length(batch) if length is None else length
    if isinstance(batch, Tensor):
        return batch[start:stop] if batch.dim() and batch.shape[0] == length else batch
    if isinstance(batch, Mapping):
        return type(batch)({k: slice_batch(v, start, stop, length) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(slice_batch(v, start, stop, length) for v in batch))
    if isinstance(batch, (list, tuple)):
        if len(batch) == length and not any(isinstance(v, Tensor) for v in batch):
            return batch[start:stop]
        return type(batch)(slice_batch(v, start, stop, length) for v in batch)
    return batch


def _ranges(spans: Any, size: int) -> deque[tuple[int, int]]:
    """``spans`` (``(start, stop)`` pairs) cut into ranges of at most ``size`` samples."""
    return deque((s, min(s + size, e)) for a, e in spans for s in range(a, e, size))


def _set_aside(params: list[Tensor]) -> tuple[list[Tensor | None], bool]:
    """The gradients held so far, and whether there were any: then they are taken off
    ``params``, so the next backward writes fresh buffers."""
    held = [p.grad for p in params]
    isolate = any(g is not None for g in held)
    if isolate:
        for p in params:
            p.grad = None
    return held, isolate


def _add_back(params: list[Tensor], held: list[Tensor | None]) -> None:
    """Add the gradients set aside to the fresh ones (in place, into the held buffers)."""
    for p, g in zip(params, held):
        if g is not None and p.grad is not None:
            p.grad = g.add_(p.grad)
        elif g is not None:
            p.grad = g


def backward_in_chunks(
    module: Any,
    batch: Any,
    loss_fn: Callable[[Any], Tensor],
    size_fn: Callable[[Any], float] | None = None,
) -> Tensor:
    """Forward and backward ``batch`` range by range; the batch's loss, detached. ``size_fn(chunk)``
    is what ``loss_fn(chunk)``'s mean is over (default: samples; a token count for tokens)."""
    from laptrain.callbacks.oom_backoff import OOMBackoff, is_oom

    if not isinstance(module, ChunkedBackward):
        raise TypeError("backward_in_chunks needs a module that inherits ChunkedBackward")
    trainer = module.trainer
    backoff = next((c for c in trainer.callbacks if isinstance(c, OOMBackoff)), None)
    n = batch_length(batch)
    queue = _ranges([(0, n)], backoff.chunk_size(n) if backoff else n)
    total = size_fn(batch) if size_fn else n
    params = [p for p in module.parameters() if p.requires_grad]
    batch_loss = torch.zeros((), device=module.device)
    done = 0
    while queue:
        start, stop = queue.popleft()
        held, isolate = _set_aside(params)
        failure = None
        try:
            chunk = slice_batch(batch, start, stop, n)
            weight = (size_fn(chunk) if size_fn else stop - start) / total
            loss = loss_fn(chunk)
            trainer.strategy.backward(loss * (weight / trainer.accumulate_grad_batches), None)
        except Exception as exc:  # only out-of-memory errors are kept, everything else re-raised
            if backoff is None or not backoff.enabled or not is_oom(exc):
                raise
            failure = f"{type(exc).__name__}: {exc}"
        if failure is not None:
            chunk = loss = None  # drop the partial graph before the cache is emptied
            for p, g in zip(params, held):
                p.grad = g
            half = backoff.handle_oom(failure, stop - start, trainer)
            queue = _ranges([(start, stop), *queue], half)
            continue
        if isolate:
            _add_back(params, held)
        batch_loss = batch_loss + loss.detach() * weight
        done += 1
    if backoff is not None:
        backoff.step_done(n, done, trainer)
    return batch_loss


class ChunkedBackward:
    """Mixin for a LightningModule whose ``training_step`` calls ``self.chunked_backward``.

    Lightning zeroes gradients *after* ``training_step`` on an accumulation window's first batch,
    which would wipe the step's own; they are zeroed after each optimizer step instead."""

    def chunked_backward(
        self,
        batch: Any,
        loss_fn: Callable[[Any], Tensor],
        size_fn: Callable[[Any], float] | None = None,
    ) -> Tensor:
        if wraps_the_module(self.trainer.strategy):  # type: ignore[attr-defined]
            # DDP reduces gradients from hooks on Lightning's own backward and refuses a backward
            # inside its forward, and FSDP asserts that a unit is not still in its forward
            # ("Expects BACKWARD_PRE or BACKWARD_POST state"): runs under either, one process
            # or several, back-propagate whole batches (no OOM backoff).
            loss = loss_fn(batch)
            if self.automatic_optimization:  # type: ignore[attr-defined]
                return loss  # Lightning back-propagates what training_step returns
            # Manual optimization: Lightning never back-propagates a returned loss, and
            # manual_backward readies DDP's reducer first (DDPStrategy.pre_backward).
            self.manual_backward(loss)  # type: ignore[attr-defined]
            return loss.detach()
        return backward_in_chunks(self, batch, loss_fn, size_fn)

    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """Skip Lightning's backward of the returned loss: every chunk was back-propagated already."""
        if loss.requires_grad:
            super().backward(loss, *args, **kwargs)  # type: ignore[misc]

    def optimizer_step(
        self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None
    ) -> None:
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)  # type: ignore[misc]
        optimizer.zero_grad(set_to_none=True)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        """Gradients were zeroed after the previous optimizer step; this batch's are kept."""
