"""Batches of similar length, in a seeded order that a resumed run continues exactly.

Long-tailed texts in random batches are mostly padding (``benchmarks/padding.py``): batches are
cut from length-sorted mega-batches (transformers' ``LengthGroupedSampler``'s idea, resumable).
Under DDP the sampler shards itself (2 ranks x 8 see what 1 rank x 16 sees), since Lightning's
``use_distributed_sampler`` would rebuild it (lightning/pytorch/utilities/data.py,
``_dataloader_init_kwargs_resolve_sampler``). ``ResumableDataLoader`` skips, restored, exactly the
batches handed out (docs/lightning.md, "Mid-epoch resume").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler


class LengthGroupedBatchSampler(Sampler[list[int]]):
    """Seeded batches of indices grouped by ``lengths``; ``shuffle=False`` gives longest-first order."""

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        mega_batches: int = 50,
        drop_last: bool = False,
        replicas: int = 1,
        rank: int = 0,
    ) -> None:
        if isinstance(lengths, Sampler):
            raise ValueError(
                "Lightning rebuilt laptrain's batch sampler (for several processes or for "
                "trainer.predict), which would give it indices for lengths: keep "
                "trainer.use_distributed_sampler=false, and predict with laptrain predict"
            )
        if batch_size < 1:
            raise ValueError(f"batch size must be >= 1 (got {batch_size}): set hardware.batch_size")
        if not 0 <= rank < replicas:
            raise ValueError(f"rank {rank} is not one of {replicas} processes")
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.mega_batches = mega_batches
        self.drop_last = drop_last
        self.replicas = replicas
        self.rank = rank
        self.epoch = 0
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning at every epoch start; the order depends on (seed, epoch)."""
        self.epoch = epoch

    @property
    def sampler(self) -> LengthGroupedBatchSampler:
        """Lightning calls ``set_epoch`` on ``batch_sampler.sampler``, never on the batch sampler
        itself (lightning.fabric.utilities.data._set_sampler_epoch): point that lookup here."""
        return self

    def batches(self) -> list[list[int]]:
        """This epoch's batches for this rank (deterministic for a given seed and epoch)."""
        return [self._part(batch) for batch in self.global_batches()]

    def _part(self, batch: list[int]) -> list[int]:
        """This rank's share of a global batch: ``batch_size`` indices of a full one; of a short
        last one, a near-equal share (sizes differ by at most 1). Fewer indices than ranks are
        repeated from the batch's start so that no rank gets an empty batch."""
        if self.replicas == 1:
            return batch
        if len(batch) < self.replicas:
            batch = (batch * self.replicas)[: self.replicas]
        m = len(batch)
        return batch[self.rank * m // self.replicas : (self.rank + 1) * m // self.replicas]

    def global_batches(self) -> list[list[int]]:
        """This epoch's batches of ``batch_size * replicas`` indices, over all ranks."""
        n = len(self.lengths)
        lengths = torch.tensor(self.lengths)
        if not self.shuffle:
            order = torch.argsort(lengths, descending=True, stable=True).tolist()
            return self._cut(order)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        perm = torch.randperm(n, generator=gen)
        if self.mega_batches <= 0:  # plain random batches, no length grouping
            return self._cut(perm.tolist())
        mega = self._global_size() * self.mega_batches
        batches: list[list[int]] = []
        for start in range(0, n, mega):
            chunk = perm[start : start + mega]
            chunk = chunk[torch.argsort(lengths[chunk], descending=True, stable=True)]
            batches.extend(self._cut(chunk.tolist()))
        order = torch.randperm(len(batches), generator=gen).tolist()
        return [batches[i] for i in order]

    def _global_size(self) -> int:
        return self.batch_size * self.replicas

    def _cut(self, indices: list[int]) -> list[list[int]]:
        size = self._global_size()
        out = [indices[i : i + size] for i in range(0, len(indices), size)]
        if self.drop_last and out and len(out[-1]) < size:
            out.pop()
        return out

    def __iter__(self) -> Iterator[list[int]]:
        skip, self.skip = self.skip, 0
        yield from self.batches()[skip:]

    def __len__(self) -> int:
        n, size = len(self.lengths), self._global_size()
        if self.drop_last:
            return n // size
        return -(-n // size)


def replicas_of(trainer: Any) -> tuple[int, int]:
    """(processes, this process's rank) of the Trainer a datamodule is attached to; (1, 0) before
    one is (the run plan sizes the data before the Trainer exists)."""
    if trainer is None:
        return 1, 0
    return int(trainer.world_size), int(trainer.global_rank)


class ResumableDistributedSampler(DistributedSampler):
    """torch's ``DistributedSampler`` (the one Lightning injects under several processes: the same
    order for the same seed and epoch, each process every ``replicas``-th index of it) that can
    start an epoch ``skip`` indices in, for a resumed run. On one process (``replicas=1``) it is the
    whole order, so 1 process at batch 2B takes the indices 2 processes at batch B take together."""

    def __init__(
        self,
        dataset: Dataset,
        replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(dataset, num_replicas=replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.skip = 0

    def __iter__(self) -> Iterator[int]:
        skip, self.skip = self.skip, 0
        order = super().__iter__()
        for _ in range(skip):
            next(order)
        yield from order


class ResumableDataLoader(DataLoader):
    """A DataLoader whose position Lightning saves and restores, over either sampler here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(self.batch_sampler, LengthGroupedBatchSampler):
            self._order: Any = self.batch_sampler
            self._per_batch = 1  # the batch sampler skips whole batches
        elif isinstance(self.sampler, ResumableDistributedSampler) and self.batch_size:
            self._order = self.sampler
            self._per_batch = self.batch_size  # the sampler skips indices
        else:
            raise TypeError(
                "ResumableDataLoader needs batch_sampler=LengthGroupedBatchSampler(...) or "
                "sampler=ResumableDistributedSampler(...) with a batch_size"
            )
        self._served = 0

    def __iter__(self) -> Iterator[Any]:
        self._served = self._order.skip // self._per_batch  # 0, or what a restored run trained on
        for batch in super().__iter__():
            self._served += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._order.epoch, "served": self._served, "seed": self._order.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._order.epoch = int(state["epoch"])
        served = int(state["served"])
        # A checkpoint taken after the epoch's last batch resumes at the next epoch's start.
        self._served = served if served < len(self) else 0
        self._order.skip = self._served * self._per_batch
