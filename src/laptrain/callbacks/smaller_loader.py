"""Cut the train loader's batch mid-epoch, keeping the effective batch and the sample position.
Lightning cannot change a DataLoader's batch once fit started, so for a module that
back-propagates whole batches ``OOMBackoff`` rebuilds laptrain's resumable loader ``factor``
times smaller from the same sample, grows accumulation by ``factor`` and recounts the fit loop's
batch counters (loops/training_epoch_loop.py counts everything in batches)."""

from __future__ import annotations

import lightning.pytorch as pl

from laptrain.data.sampler import ResumableDataLoader, ResumableDistributedSampler
from laptrain.data.user_loaders import resized_loader

COUNTERS = ("ready", "started", "processed", "completed")


def cuttable_loader(trainer: pl.Trainer) -> ResumableDataLoader | None:
    """The train loader when its position is counted in samples (a map-style loader laptrain
    rebuilt), else None (an IterableDataset, a sampler of the user's own)."""
    loader = trainer.train_dataloader
    if isinstance(loader, ResumableDataLoader) and isinstance(
        loader.sampler, ResumableDistributedSampler
    ):
        return loader
    return None


def smaller_divisor(size: int) -> int:
    """The largest micro-batch at most half of ``size`` that divides it (4 of 8, 3 of 9, 1 of 7):
    ``size`` / it accumulated batches are exactly the old batch."""
    return next(d for d in range(size // 2, 0, -1) if size % d == 0)


def cut_loader(trainer: pl.Trainer, micro_batch: int, resumed: bool = False) -> None:
    """Train on batches of ``micro_batch`` from the start of the current optimizer step on, with
    accumulation grown by the same factor. After an OOM (``resumed`` False) the epoch's batch
    counters are in the old batches and the unfinished step's batches are undone; a resumed run
    saved its counters and its loader's position in batches of ``micro_batch`` already."""
    loop, fit = trainer.fit_loop.epoch_loop, trainer.fit_loop
    loader = cuttable_loader(trainer)
    assert loader is not None and loader.batch_size % micro_batch == 0
    factor = loader.batch_size // micro_batch
    accumulate = trainer.accumulate_grad_batches
    smaller = resized_loader(loader, micro_batch, skip=0)
    if resumed:  # as ResumableDataLoader.load_state_dict: an epoch's end resumes at the next one
        ready = loop.batch_progress.current.ready
        new_start = ready if ready < len(smaller) else 0
    else:
        done = loop.batch_progress.current.completed
        new_start = (done - done % accumulate) * factor  # the interrupted step's first batch
        for name in COUNTERS:
            current, total = loop.batch_progress.current, loop.batch_progress.total
            setattr(total, name, getattr(total, name) - getattr(current, name) + new_start)
            setattr(current, name, new_start)
    smaller.sampler.skip = new_start * micro_batch
    trainer.accumulate_grad_batches = accumulate * factor
    whole = fit.max_batches == len(loader)  # else limit_train_batches cut the epoch
    fit.max_batches = len(smaller) if whole else fit.max_batches * factor
    if isinstance(trainer.val_check_batch, int):
        trainer.val_check_batch *= factor
    combined = fit._combined_loader
    combined.flattened = [smaller]
    if combined.limits is not None:
        combined.limits = [fit.max_batches]
    if fit._data_fetcher is not None:
        iter(fit._data_fetcher)  # the smaller loader's iterator, from the step's first sample
        # a resumed run: Lightning adds the epoch's batches when the epoch loop starts
        fit._data_fetcher.fetched = 0 if resumed else new_start


def optimizers_cleared(trainer: pl.Trainer) -> None:
    """Drop the gradients of the unfinished step (an OOM in a backward leaves part of them)."""
    for optimizer in trainer.optimizers:
        optimizer.zero_grad(set_to_none=True)
