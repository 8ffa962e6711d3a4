"""The classifier at smoke-test size: a tiny BERT on random token rows (three classes)."""

from __future__ import annotations

import lightning.pytorch as pl
import torch

from laptrain.model.classifier.text_classifier import TextClassifierModule
from laptrain.model.classifier.tiny_bert import tiny_bert_backbone
from laptrain.model.smoke_data import RowsData, TokenRows

BATCH, LENGTH, VOCAB = 8, 16, 64


def build(seed: int, steps: int) -> tuple[pl.LightningModule, pl.LightningDataModule]:
    """A fresh module (weights from ``seed``) and an epoch of ``steps`` batches."""
    backbone = tiny_bert_backbone(max_position_embeddings=32)
    torch.manual_seed(seed)
    module = TextClassifierModule(num_labels=3, backbone=backbone, vocab_size=VOCAB, pad_token_id=0)
    train = TokenRows(steps * BATCH, LENGTH, VOCAB, seed=1, labels=3)
    return module, RowsData(train, TokenRows(BATCH, LENGTH, VOCAB, seed=2, labels=3), BATCH)


def predict(module: pl.LightningModule, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The predicted class of each row."""
    return module(batch["input_ids"], batch["attention_mask"]).argmax(-1)
