"""A callback for end-to-end tests under several processes: which examples each rank ran.

Used through ``train.py`` as ``+callbacks.record._target_=tests.rank_record.RecordExamples
+callbacks.record.folder=<dir>``; each rank writes ``<dir>/rank<N>.json`` at the end of the fit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback


class RecordExamples(Callback):
    """Per stage, the dataset indices of every batch this rank ran (read from the loader's batch
    sampler) and the lengths the batch itself holds (its attention mask), to check one against
    the other."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.seen: dict[str, list[dict[str, list[int]]]] = {"train": [], "val": []}

    def _record(self, stage: str, loader: Any, batch: Any, batch_idx: int) -> None:
        sampler = loader.batch_sampler
        ids = (
            sampler.batches()[batch_idx] if stage == "val" else self._train_ids(sampler, batch_idx)
        )
        self.seen[stage].append(
            {
                "ids": [int(i) for i in ids],
                "expected_lengths": sorted(int(sampler.lengths[i]) for i in ids),
                "lengths": sorted(int(n) for n in batch["attention_mask"].sum(-1).tolist()),
            }
        )

    def _train_ids(self, sampler: Any, batch_idx: int) -> list[int]:
        return sampler.batches()[batch_idx]

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self._record("train", trainer.train_dataloader, batch, batch_idx)

    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        loaders = trainer.val_dataloaders
        loader = loaders[dataloader_idx] if isinstance(loaders, list) else loaders
        self._record("val", loader, batch, batch_idx)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"rank{trainer.global_rank}.json"
        path.write_text(json.dumps({"world": trainer.world_size, **self.seen}))


class RecordStartWeights(Callback):
    """Rank 0's trainable weights as the fit starts, saved to ``<folder>/start.pt``: a test then
    checks that training moved them."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.global_rank == 0:
            import torch

            self.folder.mkdir(parents=True, exist_ok=True)
            weights = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
            torch.save(weights, self.folder / "start.pt")


class RecordFrozenDtypes(Callback):
    """The dtypes of this rank's frozen parameters (a LoRA base) as the fit starts, written to
    ``<folder>/rank<N>-dtypes.json``: a test compares what each rank holds."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        dtypes = sorted({str(p.dtype) for p in pl_module.parameters() if not p.requires_grad})
        path = self.folder / f"rank{trainer.global_rank}-dtypes.json"
        path.write_text(json.dumps(dtypes))


class SignalAt(Callback):
    """Sends ``signum`` to this process on one rank only, as the batch that makes ``global_step``
    reach ``step`` begins (a scheduler that signals the main process)."""

    def __init__(self, step: int, rank: int = 0, signum: int = 15) -> None:
        self.step, self.rank, self.signum = step, rank, signum

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == self.step - 1 and trainer.global_rank == self.rank:
            import os

            os.kill(os.getpid(), self.signum)
            self.step = -1  # once


class SignalIn(Callback):
    """Sends ``signum`` to this process on the first batch of ``stage``: ``sanity`` (the sanity
    check before training), ``val`` (a validation during training) or ``test``."""

    def __init__(self, stage: str, signum: int = 15) -> None:
        self.stage, self.signum = stage, signum

    def _fire(self, stage: str) -> None:
        if stage == self.stage:
            import os

            self.stage = ""  # once
            os.kill(os.getpid(), self.signum)

    def on_validation_batch_start(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self._fire("sanity" if trainer.sanity_checking else "val")

    def on_test_batch_start(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self._fire("test")


class NaNGradientAt(Callback):
    """Writes a NaN into this rank's first non-empty gradient after the backward of the batch
    that makes ``global_step`` reach ``step``, on one rank only (under FSDP a rank holds its shard
    of the gradients, so one rank alone sees it)."""

    def __init__(self, step: int, rank: int = 1) -> None:
        self.step, self.rank = step, rank

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if trainer.global_step != self.step - 1 or trainer.global_rank != self.rank:
            return
        grad = next(p.grad for p in pl_module.parameters() if p.grad is not None and p.grad.numel())
        grad.view(-1)[0] = float("nan")
