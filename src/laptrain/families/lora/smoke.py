"""LoRA at smoke-test size: the ``llama32_3b_lora`` preset (its adapters, lora dropout, optimizer and
schedule, its base dtype, gradient checkpointing on) on a tiny random Llama, trained on packed
prompt/response rows: the data module's own packing and collator (``data.packing=true``), so every
batch carries the 4-D block-causal mask and restarting ``position_ids``.

The preset's ``base_dtype: auto`` is built as bfloat16 where the device has bfloat16 (what auto
picks for the preset's 3B base: 12.85 GB of float32 weights, over half of a laptop's budget;
``laptrain.families.lora.base_dtype``), float32 elsewhere; the adapters stay float32 (peft's
``autocast_adapter_dtype``).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from laptrain.families.lora.instructions import CausalLMCollator, PackedRows, pack
from laptrain.families.smoke_data import RowsData, build_preset, preset_config, smoke_checkpointing
from laptrain.hardware.probe import TorchProbe

PRESET = "llama32_3b_lora"
BATCH, LENGTH, VOCAB = 8, 16, 64
IGNORE = -100
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


def base_dtype(preset: str | None, bf16_supported: bool) -> str:
    """The preset's ``base_dtype`` on a device with (or without) bfloat16: ``auto`` as for the
    preset's big base (bfloat16), and bfloat16 only where the device has it."""
    value = str(preset or "float32")
    if value in ("auto", "bfloat16"):
        return "bfloat16" if bf16_supported else "float32"
    return value


def _overrides(kind: str) -> dict[str, Any]:
    preset = preset_config(PRESET, {"pretrained": None})
    dtype = base_dtype(preset.get("base_dtype"), TorchProbe(kind).bf16_supported())
    # a random tiny base instead of the hub's: the config, not the weights, is what is smoked
    return {"pretrained": None, "revision": None, "backbone": dict(BACKBONE), "base_dtype": dtype}


def packed_rows(rows: int, seed: int) -> PackedRows:
    """``rows`` rows of at most ``LENGTH`` tokens, each several prompt/response examples (3 to 8
    tokens, the first half prompt) packed by the data module's ``pack``."""
    generator = torch.Generator().manual_seed(seed)
    examples = []
    for _ in range(4 * rows):  # ~22 tokens per wanted row: more than enough to fill ``rows``
        length = int(torch.randint(3, 9, (1,), generator=generator))
        ids = torch.randint(3, VOCAB, (length,), generator=generator).tolist()
        labels = [IGNORE] * (length // 2) + ids[length // 2 :]
        examples.append({"input_ids": ids, "labels": labels})
    groups = pack([len(e["input_ids"]) for e in examples], LENGTH)
    if len(groups) < rows:
        raise RuntimeError(f"packing gave {len(groups)} rows, not {rows}")
    return PackedRows(examples, groups[:rows])


def build(
    seed: int, steps: int, kind: str = "cpu", precision: str = "32-true"
) -> tuple[pl.LightningModule, pl.LightningDataModule]:
    """One frozen base for every seed (as a hub model would be), adapters from ``seed``; the base
    in bfloat16 where ``kind`` has it."""
    torch.manual_seed(0)
    module = build_preset(PRESET, _overrides(kind), kind, precision)
    torch.manual_seed(seed)
    with torch.no_grad():  # other adapters per seed: a resume must take them from the file
        for name, param in module.named_parameters():
            if "lora_A" in name:
                param.normal_(0.0, 0.1)
    collate = CausalLMCollator(pad_token_id=0, packed=True)
    train, val = packed_rows(steps * BATCH, 1), packed_rows(BATCH, 2)
    return module, RowsData(train, val, BATCH, collate_fn=collate)


def predict(module: pl.LightningModule, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The most likely next token at each position."""
    return module(batch["input_ids"], batch["attention_mask"], batch.get("position_ids")).argmax(-1)


def note(kind: str) -> str:
    """What the cells run on ``kind``, for the table's legend."""
    cfg = preset_config(PRESET, _overrides(kind))
    lora = cfg.get("lora") or {}
    setting = cfg.get("gradient_checkpointing")
    ckpt = f"{'on' if smoke_checkpointing(setting) is True else 'off'} (preset: {setting})"
    preset_dtype = preset_config(PRESET, {"pretrained": None}).get("base_dtype")
    return (
        f"{PRESET} preset: base {cfg['base_dtype']} (preset: {preset_dtype}), adapters float32, "
        f"r {lora.get('r')}, lora dropout {lora.get('dropout')}, gradient checkpointing "
        f"{ckpt}, {cfg.get('scheduler')} schedule; Llama "
        f"{BACKBONE['num_hidden_layers']} x {BACKBONE['hidden_size']}, packed batches "
        f"({BATCH} rows x {LENGTH}, 4-D block-causal mask, position_ids)"
    )
