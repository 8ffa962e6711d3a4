"""LoRA at smoke-test size: adapters on a tiny random Llama, trained on prompt/response rows."""

from __future__ import annotations

import lightning.pytorch as pl
import torch

from laptrain.model.lora.causal_lm import CausalLMLoRAModule
from laptrain.model.smoke_data import RowsData, TokenRows

BATCH, LENGTH, VOCAB = 8, 16, 64
BACKBONE = {
    "model_type": "llama",
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32,
    "initializer_range": 0.3,
    "pad_token_id": 0,
}


def build(seed: int, steps: int) -> tuple[pl.LightningModule, pl.LightningDataModule]:
    """One frozen base for every seed (as a hub model would be), adapters from ``seed``."""
    torch.manual_seed(0)
    module = CausalLMLoRAModule(backbone=dict(BACKBONE), lora={"r": 4})
    torch.manual_seed(seed)
    with torch.no_grad():  # other adapters per seed: a resume must take them from the file
        for name, param in module.named_parameters():
            if "lora_A" in name:
                param.normal_(0.0, 0.1)

    def rows(count: int, seed: int) -> TokenRows:
        return TokenRows(count, LENGTH, VOCAB, seed=seed, low=3, padded_from=0.75)

    return module, RowsData(rows(steps * BATCH, 1), rows(BATCH, 2), BATCH)


def predict(module: pl.LightningModule, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The most likely next token at each position."""
    return module(batch["input_ids"], batch["attention_mask"]).argmax(-1)
