"""The classifier at smoke-test size: the ``tiny_classifier`` preset (its optimizer, fused where the
device has the kernels, its dropout, gradient checkpointing on) with the tiny BERT's sizes, on
random token rows (three classes)."""

from __future__ import annotations

import lightning.pytorch as pl
import torch

from laptrain.families.smoke_data import (
    RowsData,
    TokenRows,
    build_preset,
    preset_config,
    smoke_checkpointing,
    smoke_fused,
)

from .tiny_bert import tiny_bert_backbone

PRESET = "tiny_classifier"
BATCH, LENGTH, VOCAB = 8, 16, 64
# Sizes only: the preset's other backbone fields (dropout) stay.
SIZES = {
    k: v for k, v in tiny_bert_backbone(max_position_embeddings=32).items() if k != "model_type"
}


def build(
    seed: int, steps: int, kind: str = "cpu", precision: str = "32-true"
) -> tuple[pl.LightningModule, pl.LightningDataModule]:
    """A fresh module (weights from ``seed``) and an epoch of ``steps`` batches, for ``kind`` at
    ``precision`` (which decides whether AdamW is fused)."""
    torch.manual_seed(seed)
    module = build_preset(
        PRESET, {"backbone": SIZES}, kind, precision, num_labels=3, vocab_size=VOCAB, pad_token_id=0
    )
    train = TokenRows(steps * BATCH, LENGTH, VOCAB, seed=1, labels=3)
    return module, RowsData(train, TokenRows(BATCH, LENGTH, VOCAB, seed=2, labels=3), BATCH)


def predict(module: pl.LightningModule, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The predicted class of each row."""
    return module(batch["input_ids"], batch["attention_mask"]).argmax(-1)


def note(kind: str) -> str:
    """What the cells run on ``kind``, for the table's legend."""
    cfg = preset_config(PRESET, {"backbone": SIZES})
    optimizer = cfg.get("optimizer") or {}
    name = str(optimizer.get("_target_", "AdamW")).rpartition(".")[2]
    fused = {
        p: smoke_fused(cfg, kind, p)["optimizer"].get("fused") for p in ("32-true", "16-mixed")
    }
    if fused["32-true"] and not fused["16-mixed"]:
        name = f"fused {name} (unfused at 16-mixed on {kind})"
    elif fused["32-true"]:
        name = f"fused {name}"
    backbone = cfg["backbone"]
    dropout = backbone.get("hidden_dropout_prob", "default")
    setting = cfg.get("gradient_checkpointing")
    ckpt = f"{'on' if smoke_checkpointing(setting) is True else 'off'} (preset: {setting})"
    return (
        f"{PRESET} preset: {name}, dropout {dropout} (attention "
        f"{backbone.get('attention_probs_dropout_prob', 'default')}), gradient checkpointing "
        f"{ckpt}; BERT {backbone['num_hidden_layers']} x "
        f"{backbone['hidden_size']}, batch {BATCH} x {LENGTH}"
    )
