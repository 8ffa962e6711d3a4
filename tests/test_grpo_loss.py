"""The GRPO loss against hand-computed values and against TRL's own ``_compute_loss`` on the same
tensors (TRL's method called with a stand-in trainer: no model, no accelerator)."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from laptrain.families.lora.grpo_loss import group_advantages, grpo_loss, loss_sum, token_terms


def test_advantages_are_normalised_within_each_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0])
    adv = group_advantages(rewards, 4)
    std = math.sqrt(0.75 * 0.25 * 4 / 3)  # Bessel-corrected std of [1, 0, 0, 0]
    expected = [0.75 / (std + 1e-4), *[-0.25 / (std + 1e-4)] * 3, 0.0, 0.0, 0.0, 0.0]
    assert torch.allclose(adv, torch.tensor(expected))
    assert torch.allclose(group_advantages(rewards, 4, scale=False)[:4], rewards[:4] - 0.25)


def test_each_loss_type_reduces_as_computed_by_hand():
    # two completions, 3 and 1 tokens; ratio 1 (on-policy): the per-token loss is -A
    logps = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv = torch.tensor([1.0, -2.0])
    # grpo: mean over sequences of token means: (-1 + 2) / 2
    assert grpo_loss(logps, logps, adv, mask, "grpo").item() == pytest.approx(0.5)
    # dr_grpo: token sum (-3 + 2) over 2 sequences x max length 4
    assert grpo_loss(logps, logps, adv, mask, "dr_grpo", 4).item() == pytest.approx(-1 / 8)
    # dapo: token sum over the 4 completion tokens
    assert grpo_loss(logps, logps, adv, mask, "dapo").item() == pytest.approx(-1 / 4)
    with pytest.raises(ValueError, match="model.loss_type must be one of grpo, dr_grpo, dapo"):
        loss_sum(logps, mask, "ppo", 4)


def test_the_ratio_is_clipped_and_the_kl_is_k3():
    old = torch.zeros(1, 2)
    logps = torch.tensor([[math.log(1.5), math.log(0.5)]])
    terms = token_terms(logps, old, torch.tensor([1.0]), epsilon=0.2)
    # positive advantage: min(1.5, 1.2) -> -1.2 (clipped); min(0.5, 0.8) -> -0.5 (not clipped)
    assert torch.allclose(terms.loss, torch.tensor([[-1.2, -0.5]]))
    assert terms.clipped.tolist() == [[True, False]]
    assert terms.kl is None
    ref = torch.zeros(1, 2)
    with_kl = token_terms(logps, old, torch.tensor([1.0]), beta=0.1, ref_logps=ref)
    k3 = torch.exp(-logps) + logps - 1
    assert torch.allclose(with_kl.kl, k3)
    assert torch.allclose(with_kl.loss, terms.loss + 0.1 * k3)


def _trl_loss(logps, old, ref, adv, mask, loss_type, beta, max_len):
    """TRL 1.16's GRPOTrainer._compute_loss on these tensors."""
    trl = pytest.importorskip("trl.trainer.grpo_trainer")

    identity = lambda x, **_: x  # noqa: E731
    fake = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps), None),
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=beta,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        loss_type=loss_type,
        epsilon_low=0.2,
        epsilon_high=0.28,
        use_vllm=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=max_len,
        accelerator=SimpleNamespace(
            num_processes=1, gather=identity, reduce=identity, gather_for_metrics=identity
        ),
        _entropy_bonus_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
    )
    inputs = {
        "prompt_ids": torch.zeros(logps.shape[0], 1, dtype=torch.long),
        "prompt_mask": torch.ones(logps.shape[0], 1, dtype=torch.long),
        "completion_ids": torch.zeros(logps.shape, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    return trl.GRPOTrainer._compute_loss(fake, None, inputs)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_equal_to_trls_loss_and_gradient(loss_type, beta):
    gen = torch.Generator().manual_seed(0)
    shape = (6, 5)
    old = -torch.rand(shape, generator=gen) * 3
    ref = -torch.rand(shape, generator=gen) * 3
    start = old + 0.3 * torch.randn(shape, generator=gen)  # ratios both sides of the clip
    mask = (torch.rand(shape, generator=gen) > 0.3).long()
    mask[:, 0] = 1
    adv = group_advantages(torch.rand(6, generator=gen), 3)
    ours_in, trl_in = start.clone().requires_grad_(), start.clone().requires_grad_()
    ours = grpo_loss(
        ours_in, old, adv, mask, loss_type, 5, epsilon=0.2, epsilon_high=0.28, beta=beta,
        ref_logps=ref,
    )  # fmt: skip
    theirs = _trl_loss(trl_in, old, ref, adv, mask, loss_type, beta, 5)
    ours.backward()
    theirs.backward()
    assert torch.allclose(ours, theirs, atol=1e-7)
    assert torch.allclose(ours_in.grad, trl_in.grad, atol=1e-7)
