"""``laptrain doctor model=<a LoRA preset>``'s own check, ``lora training`` (its
``FAMILY.doctor_check``): three LoRA steps of a tiny Llama with gradient checkpointing on the profile's
device, after the doctor's own checks pass."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from laptrain.hardware.profile import ProfileError, validate_precision
from laptrain.model.doctor_check import Check, lightning_quiet, quiet_trainer


def _tiny_lora() -> Any:
    """A 2-layer Llama of 64 wide with LoRA on every linear layer and gradient checkpointing."""
    from functools import partial

    import torch

    from laptrain.families.lora.causal_lm import CausalLMLoRAModule

    backbone = {
        "model_type": "llama",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
    }
    return CausalLMLoRAModule(
        backbone=backbone,
        lora={"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"},
        gradient_checkpointing=True,
        optimizer=partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.0),
        scheduler="constant",
        save_adapters=False,
    )


def _losses(losses: list[float]) -> Any:
    """A callback that appends each training step's loss to ``losses``."""
    import lightning.pytorch as pl

    class Losses(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            losses.append(float(outputs["loss"]))

    return Losses()


def check_training(profile: Mapping[str, Any]) -> Check:
    """Three LoRA steps of a tiny Llama with gradient checkpointing on the profile's device.

    Checkpointing with a frozen base is where LoRA breaks silently (no gradient reaches the
    adapters: transformers#26377, #42489), so besides finite losses every lora_B matrix (zeros at
    init) must have moved.
    """
    import torch

    from laptrain.families.lora.causal_lm import refuse_precision
    from laptrain.families.lora.tiny_llama import masked_token_batches
    from laptrain.hardware.probe import TorchProbe

    kind = str(profile.get("accelerator", "cpu"))
    try:
        precision = validate_precision(
            profile.get("precision"), kind, TorchProbe(kind).bf16_supported()
        )
    except ProfileError as err:
        return Check("lora training", False, str(err), "fix hardware.precision in the profile")
    if refuse_precision(kind, precision):
        precision = "32-true"  # train.py refuses it for LoRA with its own line; test the rest
    torch.manual_seed(0)
    module = _tiny_lora()
    losses: list[float] = []
    loader = torch.utils.data.DataLoader(masked_token_batches(3), batch_size=None)
    with lightning_quiet():  # the Trainer's own "GPU available" lines too
        trainer = quiet_trainer(
            kind,
            precision,
            limit_val_batches=0,
            num_sanity_val_steps=0,
            callbacks=[_losses(losses)],
        )
        trainer.fit(module, train_dataloaders=loader)
    lora_b = [p for n, p in module.named_parameters() if "lora_B" in n]
    moved = sum(bool(p.detach().abs().sum() > 0) for p in lora_b)
    if len(losses) < 3 or not all(math.isfinite(x) for x in losses) or moved < len(lora_b):
        return Check(
            "lora training",
            False,
            f"losses {losses}, {moved}/{len(lora_b)} LoRA B matrices updated with checkpointing",
            "report this with --json output",
        )
    return Check(
        "lora training",
        True,
        f"3 LoRA steps of a tiny Llama with gradient checkpointing on {kind} in {precision}, "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, {moved}/{len(lora_b)} LoRA B matrices updated",
    )
