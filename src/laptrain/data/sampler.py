"""Batches of similar length, in a seeded order that a resumed run continues exactly.

Why: users' texts are long-tailed. With random batches and per-batch padding most of the compute
goes to pad tokens; grouping by length recovers most of it (``benchmarks/padding.py`` measures it).

``LengthGroupedBatchSampler`` shuffles indices with ``(seed, epoch)``, cuts them into mega-batches of
``batch_size * mega_batches`` indices, sorts each mega-batch by length and cuts it into batches, then
shuffles the batch order, so that batches stay random but each holds similar lengths (the same idea
as transformers' ``LengthGroupedSampler``, which is not resumable and needs the Trainer).

``ResumableDataLoader`` fills the gap Lightning leaves for mid-epoch resume (docs/lightning.md,
"Mid-epoch resume"): a plain DataLoader has no ``state_dict``, so Lightning replays the interrupted
epoch from its start. This loader counts the batches it has handed out (not what workers
prefetched) and, restored, skips exactly those.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler


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
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch size must be >= 1 (got {batch_size}): set hardware.batch_size")
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.mega_batches = mega_batches
        self.drop_last = drop_last
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
        """This epoch's full batch list (deterministic for a given seed and epoch)."""
        n = len(self.lengths)
        lengths = torch.tensor(self.lengths)
        if not self.shuffle:
            order = torch.argsort(lengths, descending=True, stable=True).tolist()
            return self._cut(order)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        perm = torch.randperm(n, generator=gen)
        if self.mega_batches <= 0:  # plain random batches, no length grouping
            return self._cut(perm.tolist())
        mega = self.batch_size * self.mega_batches
        batches: list[list[int]] = []
        for start in range(0, n, mega):
            chunk = perm[start : start + mega]
            chunk = chunk[torch.argsort(lengths[chunk], descending=True, stable=True)]
            batches.extend(self._cut(chunk.tolist()))
        order = torch.randperm(len(batches), generator=gen).tolist()
        return [batches[i] for i in order]

    def _cut(self, indices: list[int]) -> list[list[int]]:
        out = [indices[i : i + self.batch_size] for i in range(0, len(indices), self.batch_size)]
        if self.drop_last and out and len(out[-1]) < self.batch_size:
            out.pop()
        return out

    def __iter__(self) -> Iterator[list[int]]:
        skip, self.skip = self.skip, 0
        yield from self.batches()[skip:]

    def __len__(self) -> int:
        n = len(self.lengths)
        if self.drop_last:
            return n // self.batch_size
        return -(-n // self.batch_size)


class ResumableDataLoader(DataLoader):
    """A DataLoader over a ``LengthGroupedBatchSampler`` whose position Lightning saves and restores."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.batch_sampler, LengthGroupedBatchSampler):
            raise TypeError(
                "ResumableDataLoader needs batch_sampler=LengthGroupedBatchSampler(...)"
            )
        self._served = 0

    def __iter__(self) -> Iterator[Any]:
        sampler: LengthGroupedBatchSampler = self.batch_sampler  # type: ignore[assignment]
        self._served = sampler.skip  # 0, or the batches a restored run already trained on
        for batch in super().__iter__():
            self._served += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        sampler: LengthGroupedBatchSampler = self.batch_sampler  # type: ignore[assignment]
        return {"epoch": sampler.epoch, "served": self._served, "seed": sampler.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        sampler: LengthGroupedBatchSampler = self.batch_sampler  # type: ignore[assignment]
        sampler.epoch = int(state["epoch"])
        served = int(state["served"])
        # A checkpoint taken after the epoch's last batch resumes at the next epoch's start.
        sampler.skip = served if served < len(sampler) else 0
        self._served = sampler.skip
