"""The GRPO loss: a clipped policy gradient on completion tokens with group-relative advantages.

Exactly what TRL 1.16.0's ``GRPOTrainer`` computes (trl/trainer/grpo_trainer.py:
``_generate_and_score_completions`` for the advantages, ``_compute_loss`` for the loss; the
defaults from trl/trainer/grpo_config.py), for token-level importance sampling and the three
group-relative loss types:

- advantages: ``r - mean(group)``, divided by ``std(group) + 1e-4`` (Bessel-corrected std, TRL's
  ``nanstd``) unless ``scale_rewards`` is off (the Dr. GRPO paper's advice, arXiv:2503.20783);
  TRL's default ``scale_rewards="group"``.
- per token: ``ratio = exp(logp - old_logp)``, loss ``-min(ratio * A, clip(ratio, 1 - epsilon,
  1 + epsilon_high) * A)`` (TRL: ``epsilon=0.2``, ``epsilon_high=epsilon``), plus
  ``beta * kl`` with the k3 estimator ``exp(ref - logp) - (ref - logp) - 1`` (TRL: ``beta=0.0``,
  so no reference pass).
- reduction over the completion tokens (``mask``): ``grpo`` the mean over sequences of each
  sequence's token mean; ``dr_grpo`` the token sum over ``sequences x max_completion_length``;
  ``dapo`` (TRL's default) the token sum over the step's completion tokens.

With ``num_iterations=1`` (TRL's default) ``old_logp`` is the policy's own detached value, so
the ratio is 1 and only its gradient acts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_TYPES = ("grpo", "dr_grpo", "dapo")
STD_EPS = 1e-4  # TRL: advantages / (std_rewards + 1e-4)


def group_advantages(rewards: torch.Tensor, group: int, scale: bool = True) -> torch.Tensor:
    """``[N * group]`` rewards (groups consecutive) -> advantages within each group."""
    grouped = rewards.view(-1, group)
    advantages = grouped - grouped.mean(dim=1, keepdim=True)
    if scale:
        advantages = advantages / (grouped.std(dim=1, keepdim=True) + STD_EPS)
    return advantages.reshape(-1)


@dataclass
class TokenTerms:
    """Per-token loss ``[B, T]``, the k3 KL to the reference (None when ``beta`` is 0) and where
    the ratio was clipped (the clip fraction counts these)."""

    loss: torch.Tensor
    kl: torch.Tensor | None
    clipped: torch.Tensor


def token_terms(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    ref_logps: torch.Tensor | None = None,
) -> TokenTerms:
    """The clipped surrogate (and KL) per completion token; ``advantages`` ``[B]``."""
    high = epsilon if epsilon_high is None else epsilon_high
    adv = advantages[:, None]
    ratio = torch.exp(logps - old_logps)
    clipped_ratio = torch.clamp(ratio, 1 - epsilon, 1 + high)
    loss = -torch.min(ratio * adv, clipped_ratio * adv)
    clipped = ((ratio < 1 - epsilon) & (adv < 0)) | ((ratio > 1 + high) & (adv > 0))
    kl = None
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta != 0 needs the reference log-probabilities")
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        loss = loss + beta * kl
    return TokenTerms(loss, kl, clipped)


def loss_sum(
    token_loss: torch.Tensor, mask: torch.Tensor, loss_type: str, max_completion_length: int
) -> tuple[torch.Tensor, int]:
    """``(sum, count)`` whose ratio is the batch's loss; across several batches (accumulation,
    ranks) the step's loss is the sums over the counts: sequences for ``grpo`` and ``dr_grpo``,
    completion tokens for ``dapo``."""
    mask = mask.to(token_loss.dtype)
    per_token = token_loss * mask
    if loss_type == "grpo":
        return (per_token.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum(), token_loss.shape[0]
    if loss_type == "dr_grpo":
        return per_token.sum() / max_completion_length, token_loss.shape[0]
    if loss_type == "dapo":
        return per_token.sum(), int(mask.sum())
    raise ValueError(f"model.loss_type must be one of {', '.join(LOSS_TYPES)} (got {loss_type!r})")


def grpo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str = "dapo",
    max_completion_length: int = 512,
    **terms: float | torch.Tensor | None,
) -> torch.Tensor:
    """The loss of one batch that is the whole step (TRL with one process and no accumulation)."""
    total, count = loss_sum(
        token_terms(logps, old_logps, advantages, **terms).loss,  # type: ignore[arg-type]
        mask,
        loss_type,
        max_completion_length,
    )
    return total / max(count, 1)
