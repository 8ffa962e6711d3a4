"""Dynamic padding: each batch is padded to its own longest sequence, never to a fixed max length."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


def padded_length(length: int, multiple: int | None) -> int:
    """``length`` rounded up to ``multiple`` (``pad_to_multiple_of``; None or 0: unchanged): the
    width a batch whose longest row has ``length`` tokens is padded to."""
    return -(-length // multiple) * multiple if multiple else length


@dataclass
class PadCollator:
    """Stack ``input_ids`` lists into a right-padded batch with an attention mask; a dataclass, so
    spawned DataLoader workers (macOS) can pickle it."""

    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        longest = padded_length(max(len(r["input_ids"]) for r in rows), self.pad_to_multiple_of)
        ids = torch.full((len(rows), longest), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), longest), dtype=torch.long)
        for i, r in enumerate(rows):
            seq = torch.as_tensor(r["input_ids"], dtype=torch.long)
            ids[i, : len(seq)] = seq
            mask[i, : len(seq)] = 1
        batch = {"input_ids": ids, "attention_mask": mask}
        if "labels" in rows[0]:
            batch["labels"] = torch.tensor([int(r["labels"]) for r in rows], dtype=torch.long)
        return batch


def batch_length(batch: Any) -> int:
    """Number of samples: the first dimension of the first tensor found."""
    if isinstance(batch, Tensor) and batch.dim():
        return batch.shape[0]
    if isinstance(batch, Mapping):
        values = list(batch.values())
    else:
        values = batch if isinstance(batch, (list, tuple)) else []
    for value in values:
        try:
            return batch_length(value)
        except TypeError:
            continue
    raise TypeError(f"no batched tensor in a batch of type {type(batch).__name__}")
