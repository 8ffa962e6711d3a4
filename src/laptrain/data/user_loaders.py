"""A user's datamodule gets what laptrain's own build themselves: a train loader that resumes
mid-epoch exactly, and one share of the data per process under DDP / FSDP (docs/lightning.md,
"A user's plain loader").

A plain ``DataLoader`` over a map-style dataset is rebuilt, every setting kept, over a
``ResumableDistributedSampler``, which Lightning leaves in place (``_requires_distributed_sampler``,
trainer/connectors/data_connector.py:169-175); any other loader is kept, with one line saying it
will not resume exactly (none when it saves its own position).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.types import _Stateful
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from laptrain.data.contracts import ShardsItself
from laptrain.data.sampler import ResumableDataLoader, ResumableDistributedSampler, replicas_of
from laptrain.data.workers import WorkerInit, worker_context


def prepare_user_loaders(datamodule: Any, use_distributed_sampler: bool | None) -> bool:
    """The Trainer's ``use_distributed_sampler`` for ``datamodule`` (``use_distributed_sampler``:
    the config's value, None to decide here); a user's datamodule gets a resumable train loader."""
    if isinstance(datamodule, ShardsItself) and datamodule.shards_itself:
        return bool(use_distributed_sampler)
    if isinstance(datamodule, pl.LightningDataModule) and is_overridden(
        "train_dataloader", datamodule
    ):
        datamodule.train_dataloader = ResumableTrainLoader(datamodule)
    return True if use_distributed_sampler is None else bool(use_distributed_sampler)


class ResumableTrainLoader:
    """Stands in for a datamodule's ``train_dataloader``: calls the user's own, then rebuilds
    its loader as a resumable one (:func:`resumable_train_loader`). A picklable object (the
    function and the datamodule), so ``ddp_spawn`` can send the datamodule to its processes;
    ``__wrapped__`` lets Lightning see that the datamodule defines the hook."""

    def __init__(self, datamodule: Any) -> None:
        self.datamodule = datamodule
        self.__wrapped__: Callable[[Any], Any] = type(datamodule).train_dataloader

    def __call__(self) -> Any:
        loader = self.__wrapped__(self.datamodule)
        replicas, rank = replicas_of(self.datamodule.trainer)
        made, why = resumable_train_loader(loader, replicas, rank, _seed())
        if why:
            rank_zero_info(f"train loader: {why}; a run stopped mid-epoch will not resume exactly")
        return made


def resumable_train_loader(
    loader: Any, replicas: int = 1, rank: int = 0, seed: int = 0
) -> tuple[Any, str]:
    """``loader`` rebuilt as a ``ResumableDataLoader`` for process ``rank`` of ``replicas``, and
    ``""``; or ``loader`` itself and why it cannot be (``""`` when it saves its own position)."""
    if isinstance(loader, _Stateful):
        return loader, ""
    if not isinstance(loader, DataLoader):
        return loader, f"{type(loader).__name__} is not a DataLoader"
    if isinstance(loader.dataset, IterableDataset):
        return loader, "an IterableDataset has no position to save"
    if type(loader) is not DataLoader:
        return loader, f"{type(loader).__name__} is a DataLoader subclass laptrain cannot rebuild"
    sampler = loader.sampler
    plain_random = (
        isinstance(sampler, RandomSampler)
        and type(sampler) is RandomSampler
        and not sampler.replacement
        and sampler._num_samples is None
    )
    if not (plain_random or type(sampler) is SequentialSampler):
        return loader, f"its sampler ({type(sampler).__name__}) is the datamodule's own"
    if type(loader.batch_sampler) is not BatchSampler:
        return loader, f"its batch sampler ({type(loader.batch_sampler).__name__}) is its own"
    order = ResumableDistributedSampler(
        loader.dataset, replicas=replicas, rank=rank, shuffle=plain_random, seed=seed
    )
    return ResumableDataLoader(loader.dataset, sampler=order, **_settings(loader, rank)), ""


def resized_loader(loader: ResumableDataLoader, batch_size: int, skip: int) -> ResumableDataLoader:
    """``loader`` with batches of ``batch_size``, same order, starting ``skip`` indices in."""
    loader.sampler.skip = skip
    return ResumableDataLoader(
        loader.dataset, sampler=loader.sampler, **{**_settings(loader, 0), "batch_size": batch_size}
    )


def _settings(loader: DataLoader, rank: int) -> dict[str, Any]:
    """Every setting of ``loader`` but its order. Workers with no ``worker_init_fn`` of the user's
    get laptrain's, which leaves Ctrl-C and SIGTERM to the main process (data/workers.py), and a
    private generator draws the workers' base seed, so that starting an iterator (a resumed run
    starts one mid-epoch) does not move the global generator that dropout reads."""
    settings: dict[str, Any] = {
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
        "collate_fn": loader.collate_fn,
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
        "in_order": loader.in_order,
    }
    if loader.generator is None:
        settings["generator"] = torch.Generator().manual_seed(_seed())
    if loader.num_workers > 0 and loader.worker_init_fn is None:
        settings["worker_init_fn"] = WorkerInit(rank)
        if loader.multiprocessing_context is None:
            settings["multiprocessing_context"] = worker_context()
    return settings


def _seed() -> int:
    """The seed Lightning's own distributed sampler uses (``seed_everything`` sets it)."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))
