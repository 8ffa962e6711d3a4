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
