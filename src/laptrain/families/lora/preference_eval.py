"""``laptrain eval <run> --data pairs.jsonl``: a run's DPO metrics on a preference file.

When the file's rows are preference pairs (``chosen`` and ``rejected``; the shapes of
``laptrain.families.lora.preference_rows``), ``laptrain eval`` reports what a DPO run logs, on that file:
the DPO loss, the reward accuracy and margin (rewards = ``beta`` x the adapter's log-probability
of each answer minus the base's, ``beta`` as the run trained with it), and the mean log-probability
of the chosen and rejected answers with and without the adapter. Each answer is encoded as in
training (chat template, answer tokens only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from laptrain.families.lora.dpo import dpo_terms, summed_logps
from laptrain.families.lora.instructions import IGNORE, encode_chat, padded_examples

DEFAULT_BETA = 0.1


def is_preference_file(path: str | Path) -> bool:
    """Whether the file's first readable row holds ``chosen`` and ``rejected``."""
    from laptrain.families.lora.instruction_rows import read_rows

    for _, row in read_rows(Path(path)):
        if isinstance(row, dict):
            return "chosen" in row and "rejected" in row
    return False


def read_pairs(
    tokenizer: Any, path: str | Path, max_length: int | None = None
) -> list[tuple[tuple[list[int], list[int]], tuple[list[int], list[int]]]]:
    """``((chosen ids, labels), (rejected ids, labels))`` per row, or one error naming bad rows."""
    from laptrain.families.lora.preference_rows import read_preferences

    rows = read_preferences({"train": str(path)})["train"]
    pairs = []
    for _, (prompt, chosen, rejected), _ in rows:
        sides = []
        for answer in (chosen, rejected):
            messages = [*prompt, {"role": "assistant", "content": answer}]
            ids, labels, _ = encode_chat(tokenizer, messages, max_length)
            sides.append((ids, labels))
        pairs.append((sides[0], sides[1]))
    return pairs


def sequence_logps(model: Any, sequences: list[tuple[list[int], list[int]]]) -> torch.Tensor:
    """Summed log-probability of each sequence's labelled tokens, float32 ``[N]``."""
    ids, mask, labels = padded_examples(sequences)
    device = model.device
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits[:, :-1]
    targets = labels[:, 1:].to(device)
    keep = targets != IGNORE
    return summed_logps(logits[keep], targets, keep).cpu()


@dataclass
class PreferenceResult:
    adapter: Path
    pairs: int
    beta: float
    stats: dict[str, float]
    base_logps: tuple[float, float]  # chosen, rejected
    base_accuracy: float  # share of pairs the base itself gives the chosen answer more probability

    def markdown(self) -> str:
        s = self.stats
        lines = [
            "| metric | value |",
            "|---|---:|",
            f"| DPO loss (beta {self.beta:g}) | {s['loss']:.4f} |",
            f"| reward accuracy | {s['reward_accuracy']:.4f} |",
            f"| reward margin | {s['reward_margin']:.4f} |",
            f"| log p chosen: adapter / base | {s['logps_chosen']:.2f} / {self.base_logps[0]:.2f} |",
            f"| log p rejected: adapter / base | {s['logps_rejected']:.2f} / "
            f"{self.base_logps[1]:.2f} |",
            "",
            f"{self.pairs} pairs; the base alone prefers the chosen answer in "
            f"{self.base_accuracy:.1%} of them",
        ]
        return "\n".join(lines)


def run_beta(adapter: Path) -> float:
    """The ``beta`` the run trained with (``training_config.json``), else 0.1."""
    try:
        hparams = json.loads((adapter / "training_config.json").read_text()).get("hparams") or {}
    except (OSError, ValueError):
        return DEFAULT_BETA
    return float(hparams.get("beta") or DEFAULT_BETA)


def evaluate_preferences(
    model: Any, adapter: Path, pairs: list, batch_size: int = 8
) -> PreferenceResult:
    """The DPO metrics of ``model`` (a peft model: adapters on, and off for the reference)."""
    beta = run_beta(adapter)
    policy, reference = [], []
    with torch.no_grad():
        for start in range(0, len(pairs), batch_size):
            chunk = [seq for pair in pairs[start : start + batch_size] for seq in pair]
            policy.append(sequence_logps(model, chunk).view(-1, 2))
            with model.disable_adapter():
                reference.append(sequence_logps(model, chunk).view(-1, 2))
    if not policy:
        raise ValueError("the preference file has no pairs to evaluate")
    pol, ref = torch.cat(policy), torch.cat(reference)
    _, stats = dpo_terms(pol, ref, beta)
    return PreferenceResult(
        adapter=adapter,
        pairs=int(pol.shape[0]),
        beta=beta,
        stats={k: float(v.float().mean()) for k, v in stats.items()},
        base_logps=(float(ref[:, 0].mean()), float(ref[:, 1].mean())),
        base_accuracy=float((ref[:, 0] > ref[:, 1]).float().mean()),
    )
