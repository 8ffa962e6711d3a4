"""DPO (direct preference optimisation) on the LoRA family: the adapters learn to prefer the chosen
answer over the rejected one, relative to the base model.

The loss is the sigmoid DPO loss of Rafailov et al. (2023, arXiv:2305.18290), per pair

    -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))

where ``pi_*`` and ``ref_*`` are the summed log-probabilities of the chosen (c) and rejected (r)
answer tokens under the fine-tuned model and the reference model. IPO and label smoothing are left
out: both answer a noisy-label problem (the same pair labelled both ways) that a preference set
built from ground truth, like the offline one, does not have, and each adds a knob whose right
value depends on the data.

The reference model is the same base with the adapters switched off (peft's
``disable_adapter()``), run without gradients on the same batch: no second copy of the weights
and no cache to invalidate; the price is one more forward pass per step (measured in
docs/dpo.md). With ``init_adapters`` (a LoRA run continued by DPO) the reference is still the base
without adapters.

Everything else is ``CausalLMLoRAModule``'s: the base loading, adapters, export, exact resume,
OOM backoff (``ChunkedBackward`` cuts a batch between pairs, never inside one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric

from laptrain.families.lora.causal_lm import CausalLMLoRAModule, response_head
from laptrain.families.lora.instructions import IGNORE

STATS = ("loss", "reward_accuracy", "reward_margin", "logps_chosen", "logps_rejected")


def dpo_terms(
    policy: torch.Tensor, reference: torch.Tensor, beta: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-pair DPO losses and the statistics a user reads, from ``[B, 2]`` log-probabilities
    (column 0 chosen, 1 rejected)."""
    rewards = beta * (policy - reference.detach())
    margin = rewards[:, 0] - rewards[:, 1]
    losses = -F.logsigmoid(margin)
    stats = {
        "loss": losses.detach(),
        "reward_accuracy": (margin > 0).float().detach(),
        "reward_margin": margin.detach(),
        "logps_chosen": policy[:, 0].detach(),
        "logps_rejected": policy[:, 1].detach(),
    }
    return losses, stats


def summed_logps(picked: torch.Tensor, targets: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Per row of ``keep`` (``[N, L]``), the summed log-probability of its kept ``targets`` under
    ``picked``, the logits at the kept positions in row-major order; float32 ``[N]`` whatever the
    default dtype (``64-true`` makes it float64)."""
    token = torch.log_softmax(picked.float(), dim=-1).gather(-1, targets[keep][:, None])
    rows = keep.nonzero()[:, 0]
    sums = torch.zeros(keep.shape[0], dtype=torch.float32, device=token.device)
    return sums.index_add(0, rows, token.squeeze(-1))


def load_adapters(peft_model: Any, path: str | Path) -> Path:
    """The adapter weights of a LoRA run (or adapter folder) into ``peft_model``; the adapter must
    have the same rank and target modules. One-line ValueError otherwise."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    from laptrain.families.lora.adapter_folders import find_adapter

    adapter = find_adapter(path)
    saved = json.loads((adapter / "adapter_config.json").read_text())
    ours = peft_model.peft_config["default"]
    theirs = set(saved.get("target_modules") or [])
    if saved.get("r") != ours.r or theirs != set(ours.target_modules or []):
        raise ValueError(
            f"model.init_adapters={path}: its adapters are rank {saved.get('r')} on "
            f"{sorted(theirs)}, this model's rank {ours.r} on {sorted(ours.target_modules)}: set "
            "model.lora.r and model.lora.target_modules as that run had them"
        )
    try:
        result = set_peft_model_state_dict(peft_model, load_peft_weights(str(adapter), "cpu"))
    except RuntimeError as err:
        raise ValueError(
            f"model.init_adapters={path}: its adapters do not fit this base "
            f"({str(err).splitlines()[0][:120]}): start from a run on the same model.pretrained"
        ) from None
    if result.unexpected_keys:
        raise ValueError(
            f"model.init_adapters={path}: {len(result.unexpected_keys)} of its tensors have no "
            "place in this model: start from a run on the same model.pretrained"
        )
    return adapter


class DPOLoRAModule(CausalLMLoRAModule):
    """LoRA trained with the DPO loss on ``[B, 2, L]`` preference batches
    (``laptrain.families.lora.preferences``).

    Args:
        beta: how far the fine-tune may move from the reference (the base); > 0. 0.1 is the
            paper's and TRL's default.
        init_adapters: a LoRA run or adapter folder to start from (instruction tuning, then DPO).
        Others as ``CausalLMLoRAModule``.
    """

    def __init__(
        self, *args: Any, beta: float = 0.1, init_adapters: str | None = None, **kwargs: Any
    ) -> None:
        if not beta > 0:
            raise ValueError(f"model.beta={beta}: DPO needs beta > 0 (0.1 is the usual start)")
        super().__init__(*args, **kwargs)
        self.beta = float(beta)
        if init_adapters:
            load_adapters(self.model, init_adapters)
        self.val_stats = torch.nn.ModuleDict({k: MeanMetric() for k in STATS})
        self.test_stats = torch.nn.ModuleDict({k: MeanMetric() for k in STATS})

    def _sequence_logps(self, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor):
        """Summed log-probability of each row's labelled (answer) tokens, float32 ``[N]``.

        As in ``CausalLMLoRAModule._loss_sum``, the output head runs on answer positions only
        where the architecture allows."""
        targets = labels[:, 1:]
        keep = targets != IGNORE
        parts = response_head(self.model)
        if parts is None:
            picked = self(ids, mask)[:, :-1][keep]
        else:
            decoder, head = parts
            hidden = decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            picked = head(hidden[:, :-1][keep])
        return summed_logps(picked, targets, keep)

    def pair_logps(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, 2]`` log-probabilities under the model and under the reference (no adapters)."""
        pairs, _, width = batch["input_ids"].shape
        flat = [
            batch[k].reshape(pairs * 2, width) for k in ("input_ids", "attention_mask", "labels")
        ]
        # The reference first: its logits come and go before the policy's activations are held,
        # so the step's peak is the policy pass's alone (measured in docs/dpo.md).
        with torch.no_grad(), self.model.disable_adapter():
            reference = self._sequence_logps(*flat).view(pairs, 2)
        policy = self._sequence_logps(*flat).view(pairs, 2)
        return policy, reference

    def preflight_batch(self, batch_size: int, seq_len: int) -> dict[str, torch.Tensor]:
        """Random pairs as the step sees them (``laptrain.model.contracts.SizesItsStep``): two
        sequences per example, every position after the first labelled."""
        vocab = int(self.model.get_input_embeddings().weight.shape[0])
        generator = torch.Generator().manual_seed(batch_size * 100_003 + seq_len)
        ids = torch.randint(0, vocab, (batch_size, 2, seq_len), generator=generator)
        labels = ids.clone()
        labels[..., 0] = IGNORE
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}

    def preflight_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The step's loss: both sequences with the adapters, the reference pass without."""
        batch = {k: v.to(self.device) for k, v in batch.items()}
        losses, _ = dpo_terms(*self.pair_logps(batch), self.beta)
        return losses.mean()

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        pairs = batch["input_ids"].shape[0]
        # The step's loss is the mean over its pairs on every rank and batch together: a rank (or
        # an accumulated batch) with fewer pairs weighs less, as in one process.
        scale = self._share_of_step(pairs)
        sums = {k: torch.zeros((), device=self.device) for k in STATS}

        def loss_of(chunk: dict[str, torch.Tensor]) -> torch.Tensor:
            losses, stats = dpo_terms(*self.pair_logps(chunk), self.beta)
            for key, values in stats.items():
                sums[key] = sums[key] + values.sum()
            return losses.mean() * scale

        loss = self.chunked_backward(batch, loss_of)
        for key in STATS[1:]:
            self.log(f"train/{key}", sums[key] / pairs, on_step=True, batch_size=pairs)
        self.log("train/loss", loss.detach() / scale, on_step=True, prog_bar=True, batch_size=pairs)
        return loss

    def _eval_step(self, metrics: Any, batch: dict[str, torch.Tensor]) -> None:  # type: ignore[override]
        _, stats = dpo_terms(*self.pair_logps(batch), self.beta)
        for key, values in stats.items():
            metrics[key].update(values)

    def _log_eval(self, stage: str, metrics: Any) -> None:  # type: ignore[override]
        if self.trainer.world_size == 1 and metrics["loss"].weight == 0:
            return
        for key in STATS:
            value = metrics[key].compute()  # a collective under DDP: every rank calls it
            metrics[key].reset()
            self.log(f"{stage}/{key}", value, prog_bar=key in ("loss", "reward_accuracy"),
                     sync_dist=True)  # fmt: skip

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(self.val_stats, batch)

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val", self.val_stats)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(self.test_stats, batch)

    def on_test_epoch_end(self) -> None:
        self._log_eval("test", self.test_stats)
