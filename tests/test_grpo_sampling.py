"""GRPO's sampling (``grpo_sampling.sample``): the prompt forward computes the logits of the last
position only, and the completions are the ones the full logits give."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from laptrain.families.lora.grpo_sampling import prompt_generators, sample


class AllLogits(LlamaForCausalLM):
    """The model as before ``logits_to_keep``: every forward computes every position's logits."""

    def forward(self, *args, logits_to_keep=0, **kwargs):
        return super().forward(*args, **kwargs)


def test_the_prompt_forward_keeps_one_positions_logits_and_draws_the_same_completions():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    full = AllLogits(config).eval()
    full.load_state_dict(model.state_dict())
    ids = torch.randint(1, 64, (2, 9)).repeat_interleave(4, 0)
    mask = torch.ones_like(ids)
    mask[4:, :3] = 0  # the second prompt is left-padded

    widths = []
    model.register_forward_hook(lambda m, a, out: widths.append(out.logits.shape[1]))

    def draw(m: LlamaForCausalLM) -> torch.Tensor:
        return sample(m, ids, mask, 6, [-1], 0, prompt_generators(1, 0, [0, 1]), temperature=1.0)[0]

    assert torch.equal(draw(model), draw(full))
    assert widths[0] == 1  # not the 9 prompt positions


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    return LlamaForCausalLM(config)


def _groups() -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts, the second left-padded, each repeated for a group of 4."""
    ids = torch.randint(1, 64, (2, 9)).repeat_interleave(4, 0)
    mask = torch.ones_like(ids)
    mask[4:, :3] = 0
    return ids, mask


def test_a_groups_prompt_runs_once_and_draws_what_each_row_alone_would(monkeypatch):
    import laptrain.families.lora.grpo_sampling as sampling

    model = _tiny_llama().eval()
    ids, mask = _groups()
    rows = []
    model.register_forward_hook(lambda m, a, kw, out: rows.append(kw["input_ids"].shape),
                                with_kwargs=True)  # fmt: skip

    def draw() -> tuple[torch.Tensor, torch.Tensor]:
        return sample(model, ids, mask, 6, [5], 0, prompt_generators(1, 0, [0, 1]), 1.0)

    shared = draw()
    assert rows[0] == (2, 9)  # one prompt forward per group, not 8
    monkeypatch.setattr(sampling, "prompt_groups", lambda ids, mask: None)
    rows.clear()
    alone = draw()
    assert rows[0] == (8, 9)
    assert torch.equal(shared[0], alone[0]) and torch.equal(shared[1], alone[1])


def test_shared_prompt_log_probs_and_gradients_match_the_full_pass():
    from laptrain.families.lora.grpo_sampling import completion_logps

    model = _tiny_llama()
    ids, mask = _groups()
    done = torch.randint(1, 64, (8, 5))
    done_mask = torch.ones_like(done)
    done_mask[1, 3:] = 0  # a completion that stopped early
    head = (model.model, model.lm_head)

    def pass_(share: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        logps = completion_logps(model, ids, mask, done, done_mask, 0.7, head, share)
        (logps * done_mask).sum().backward()
        return logps.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    (shared, shared_grads), (full, full_grads) = pass_(True), pass_(False)
    assert torch.allclose(shared * done_mask, full * done_mask, atol=1e-5)
    assert len(shared_grads) == len(full_grads)
    for a, b in zip(shared_grads, full_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
