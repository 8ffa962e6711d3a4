"""GRPO's step in ``laptrain preflight`` (``sizing.py``): what a rollout adds to a LoRA estimate.

One step of ``GRPOLoRAModule`` runs three phases one after the other, each freeing what it held:

- sampling (no grad): ``num_generations`` x prompts sequences, each with a KV cache of prompt +
  ``max_new_tokens`` positions (layers x 2 x kv heads x head dim x the base's bytes), and one
  position's logits per sequence (``grpo_sampling.sample`` asks the prompt forward for the last
  position's only, ``logits_to_keep=1``);
- the reference pass when ``beta`` > 0 (no grad): the completions' float32 logits and their
  temperature-scaled copy;
- the policy pass and its backward over the group, measured like any causal-LM step
  (``sizing.measure_lora_activations``) but on GRPO's own loss: ``completion_logps`` with the head
  on the completion positions only, so the saved float32 logits are completions x
  ``max_new_tokens`` x vocab. Without adapter dropout or gradient checkpointing each group's
  prompt runs once (``grpo_sampling``): that pass is measured per group, the other per sequence.

The step's peak is the largest of the three on top of the weights, adapters and optimizer state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Rollout:
    """What sizes a GRPO rollout: the group, the completion length, the KL weight, temperature."""

    generations: int
    max_new_tokens: int
    beta: float
    temperature: float

    def sequences(self, prompts: int) -> int:
        return self.generations * prompts


def rollout_of(model_cfg: Mapping[str, Any]) -> Rollout | None:
    """The rollout of a GRPO model config; None for other LoRA models."""
    if "num_generations" not in model_cfg:
        return None
    return Rollout(
        int(model_cfg["num_generations"]),
        int(model_cfg.get("max_new_tokens", 64)),
        float(model_cfg.get("beta", 0.0)),
        float(model_cfg.get("temperature", 1.0)),
    )


def head_dim(config: Any) -> int:
    return int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )


def kv_cache_bytes(config: Any, sequences: int, positions: int, dtype_bytes: int) -> float:
    """Keys and values of every layer for ``sequences`` x ``positions`` tokens."""
    kv_heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    per_token = int(config.num_hidden_layers) * 2 * kv_heads * head_dim(config) * dtype_bytes
    return float(sequences * positions * per_token)


def sampling_bytes(
    config: Any, rollout: Rollout, prompts: int, prompt_len: int, dtype_bytes: int
) -> float:
    """The sampling phase's peak: the full KV cache and one position's logits per sequence."""
    n = rollout.sequences(prompts)
    cache = kv_cache_bytes(config, n, prompt_len + rollout.max_new_tokens, dtype_bytes)
    return cache + float(n * int(config.vocab_size) * dtype_bytes)


def reference_bytes(config: Any, rollout: Rollout, prompts: int) -> float:
    """The reference pass (``beta`` > 0 only): the completions' fp32 logits, scaled once."""
    if rollout.beta == 0.0:
        return 0.0
    n = rollout.sequences(prompts)
    return float(2 * n * rollout.max_new_tokens * int(config.vocab_size) * 4)


def policy_batch_maker(vocab: int, rollout: Rollout, grouped: bool = False):
    """Batches for ``measure_activations``: ``batch`` sequences of a ``length``-token prompt and
    ``max_new_tokens`` completion tokens (the length the fit extrapolates in is the prompt's);
    ``grouped``: ``batch`` groups, each prompt repeated for its ``generations`` completions (what
    the policy pass runs once per group when it shares prompts)."""

    def make(batch: int, length: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(batch * 100_003 + length)
        prompt = torch.randint(0, vocab, (batch, length), generator=generator)
        rows = batch * rollout.generations if grouped else batch
        done = torch.randint(0, vocab, (rows, rollout.max_new_tokens), generator=generator)
        if grouped:
            prompt = prompt.repeat_interleave(rollout.generations, 0)
        return {"prompt_ids": prompt, "completion_ids": done}

    return make


def policy_loss(rollout: Rollout, grouped: bool = False):
    """GRPO's policy pass on a batch of ``policy_batch_maker``: completion log-probabilities with
    the head on completion positions, as ``GRPOLoRAModule._logps`` takes them (each group's prompt
    run once with ``grouped``)."""
    from laptrain.families.lora.causal_lm import response_head
    from laptrain.families.lora.grpo_sampling import completion_logps

    def loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        prompt, done = batch["prompt_ids"], batch["completion_ids"]
        logps = completion_logps(
            model, prompt, torch.ones_like(prompt), done, torch.ones_like(done),
            rollout.temperature, response_head(model), grouped,
        )  # fmt: skip
        return -logps.mean()

    return loss
