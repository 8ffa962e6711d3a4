"""Toy data for the families' smoke builds (``laptrain/model/<family>/smoke.py``): random token
rows served in fixed batches, a training epoch of ``steps`` batches and one validation batch.
The device smoke test (``laptrain/devices/``) fits, saves, resumes and predicts on them."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset


class TokenRows(Dataset):
    """Random token ids (``low`` and up, below ``vocab``); ``padded_from`` of the length is padding
    (id 0, mask 0) in the second half of the rows, so the mask path runs too. Labels: the first
    token modulo ``labels`` (a class), or with ``labels=None`` the ids themselves with the first
    half of each row and the padding ignored (-100: a prompt and its response)."""

    def __init__(
        self,
        rows: int,
        length: int,
        vocab: int,
        seed: int,
        labels: int | None = None,
        low: int = 2,
        padded_from: float = 0.5,
    ) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(low, vocab, (rows, length), generator=generator)
        self.mask = torch.ones_like(self.ids)
        self.mask[rows // 2 :, int(padded_from * length) :] = 0
        self.ids[self.mask == 0] = 0
        if labels is not None:
            self.labels = self.ids[:, 0] % labels
        else:
            self.labels = self.ids.clone()
            self.labels[:, : length // 2] = -100
            self.labels[self.mask == 0] = -100

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


class RowsData(pl.LightningDataModule):
    """``train`` and ``val`` datasets served in batches of ``batch_size``, in order."""

    def __init__(self, train: Dataset, val: Dataset, batch_size: int = 8) -> None:
        super().__init__()
        self.train, self.val, self.batch_size = train, val, batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.batch_size)
