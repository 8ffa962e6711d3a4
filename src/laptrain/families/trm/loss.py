"""Answer and halting losses of TRM (docs/trm.md §2)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

LOSSES = ("stablemax", "softmax")


def stablemax_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """log of stable-max probabilities, in float64 (float32 on MPS, which has no float64).

    ``s(x) = x + 1`` for x >= 0 and ``1 / (1 - x)`` for x < 0; ``p_i = s(x_i) / sum_j s(x_j)``
    (Prieto et al. 2025 as used by the paper §6; docs/trm.md §2).
    """
    x = logits.float() if logits.device.type == "mps" else logits.double()
    s = torch.where(x >= 0, x + 1, 1 / (1 - torch.clamp(x, max=0)))
    return torch.log(s) - torch.log(s.sum(dim=-1, keepdim=True))


def per_puzzle_answer_loss(logits: torch.Tensor, labels: torch.Tensor, kind: str) -> torch.Tensor:
    """Cross-entropy averaged over a puzzle's cells: [B, L, V], [B, L] -> [B] (float32)."""
    if kind == "stablemax":
        log_probs = stablemax_log_probs(logits)
    elif kind == "softmax":
        log_probs = F.log_softmax(logits.float(), dim=-1)
    else:
        raise ValueError(f"model loss={kind!r}: choose one of {LOSSES}")
    token_nll = -log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return token_nll.mean(dim=-1).float()


def halt_loss(halt_logit: torch.Tensor, solved: torch.Tensor) -> torch.Tensor:
    """BCE between the halt logit and "the whole grid is right", per puzzle: [B] -> [B]."""
    return F.binary_cross_entropy_with_logits(halt_logit, solved.float(), reduction="none")
