"""Completions for GRPO: KV-cache sampling with one ``torch.Generator`` per prompt, and the
per-token log-probabilities of completions.

transformers' ``generate`` draws from the global RNG (``torch.multinomial`` without a
generator), so a resumed run could not replay its rollouts without replaying every other draw
too. Here each prompt's group draws its tokens on the CPU (a few kilobytes per token moved; the
same draws on every device) from a generator of its own, seeded from the run's seed, the epoch
and the prompt's row in its split (``prompt_generators``): a prompt's completions do not depend on
the other prompts of its batch, the batch size or the number of processes, and a resumed run
needs no generator state, only the prompt position the resumable loader restores.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch: 0 at each row's first real token."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _forward_parameters(model: Any) -> set[str]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return set(inspect.signature(base.forward).parameters)


def _cache_name(model: Any) -> str:
    """The forward's KV-cache argument: ``cache`` (transformers >= 5.x's new name, which warns
    on the old one) or ``past_key_values``."""
    return "cache" if "cache" in _forward_parameters(model) else "past_key_values"


def _last_logits_only(model: Any) -> dict[str, int]:
    """``logits_to_keep=1`` where the forward takes it: the prompt forward's head runs on the
    last position only, not on every prompt position (sequences x prompt x vocab logits)."""
    return {"logits_to_keep": 1} if "logits_to_keep" in _forward_parameters(model) else {}


def prompt_groups(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
    """Each row's index among the batch's distinct prompts, where rows repeat their prompt in
    consecutive runs (a group's ``num_generations`` copies); None where every row differs."""
    new = torch.ones(ids.shape[0], dtype=torch.bool, device=ids.device)
    new[1:] = ((ids[1:] != ids[:-1]) | (mask[1:] != mask[:-1])).any(1)
    return None if bool(new.all()) else new.long().cumsum(0) - 1


def _first_rows(group: torch.Tensor) -> torch.Tensor:
    """The first row of each group (the prompt run once)."""
    first = torch.ones_like(group, dtype=torch.bool)
    first[1:] = group[1:] != group[:-1]
    return first


def prompt_generators(seed: int, epoch: int, rows: list[int]) -> list[torch.Generator]:
    """One generator per prompt, seeded from (``seed``, ``epoch``, the prompt's row in its split):
    each prompt of an epoch draws its own stream, whichever batch or process it lands in."""
    return [
        torch.Generator().manual_seed(((seed * 1_000_003 + epoch) * 1_000_000_007 + row) % 2**63)
        for row in rows
    ]


def _pick(
    logits: torch.Tensor, generators: list[torch.Generator] | None, temperature: float,
    top_p: float,
) -> torch.Tensor:  # fmt: skip
    """The next token of each row: argmax without ``generators``, else drawn at ``temperature``
    from the smallest set of tokens holding ``top_p`` of the probability, the rows cut into
    ``len(generators)`` equal consecutive blocks (a prompt's group each), each block from its
    own generator."""
    if generators is None:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs >= top_p  # the first token always stays
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    blocks = probs.split(probs.shape[0] // len(generators))
    drawn = [torch.multinomial(b, 1, generator=g) for b, g in zip(blocks, generators, strict=True)]
    return torch.cat(drawn).squeeze(-1).to(logits.device)


def _prefill(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, name: str
) -> tuple[Any, torch.Tensor]:
    """The prompts' forward with the cache, and each row's next-token logits; a prompt that rows
    repeat in a row (a group's copies) runs once and its keys and values are copied to them."""
    group = prompt_groups(ids, mask)
    first = slice(None) if group is None else _first_rows(group)
    out = model(
        input_ids=ids[first],
        attention_mask=mask[first],
        position_ids=_positions(mask[first]),
        use_cache=True,
        **_last_logits_only(model),
    )
    if group is None:
        return out, out.logits[:, -1]
    out[name].batch_select_indices(group)
    return out, out.logits[group, -1]


@torch.no_grad()
def sample(
    model: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    max_new_tokens: int,
    stop_ids: list[int],
    pad_id: int,
    generators: list[torch.Generator] | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(completion_ids, completion_mask)`` ``[B, T]`` for left-padded prompts, ``T <=
    max_new_tokens``; a completion ends with its first stop token (kept, as TRL keeps EOS), then
    pads (mask 0). Greedy without ``generators``; with them, ``B`` rows in ``len(generators)``
    consecutive blocks, each drawn from its generator. Rows that repeat a prompt in a row (a
    group's copies) share one prompt forward. Runs in eval mode (no dropout)."""
    was_training = model.training
    model.eval()
    name = _cache_name(model)
    try:
        mask = prompt_mask
        out, logits = _prefill(model, prompt_ids, prompt_mask, name)
        stops = torch.tensor(stop_ids, device=prompt_ids.device)
        done = torch.zeros(prompt_ids.shape[0], dtype=torch.bool, device=prompt_ids.device)
        tokens, live = [], []
        for _ in range(max_new_tokens):
            token = _pick(logits, generators, temperature, top_p)
            token = token.masked_fill(done, pad_id)
            tokens.append(token)
            live.append(~done)
            done = done | torch.isin(token, stops)
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            out = model(
                input_ids=token[:, None],
                attention_mask=mask,
                position_ids=_positions(mask)[:, -1:],
                use_cache=True,
                **{name: out[name]},
            )
            logits = out.logits[:, -1]
        return torch.stack(tokens, 1), torch.stack(live, 1).long()
    finally:
        model.train(was_training)


def completion_logps(
    model: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    head: tuple[torch.nn.Module, torch.nn.Module] | None = None,
    share_prompts: bool = False,
) -> torch.Tensor:
    """Float32 ``[B, T]`` log-probabilities of the completion tokens, from logits divided by the
    sampling ``temperature`` (as TRL's ``_get_per_token_logps_and_entropies``). With ``head``
    (decoder, output head: ``causal_lm.response_head``) the head runs on completion positions
    only; with ``share_prompts`` too, rows repeating a prompt in a row run it once
    (:func:`_shared_prompt_hidden`)."""
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)
    width = completion_ids.shape[1]
    kwargs = {"attention_mask": mask, "position_ids": _positions(mask), "use_cache": False}
    group = prompt_groups(prompt_ids, prompt_mask) if head is not None and share_prompts else None
    if head is None:
        logits = model(input_ids=ids, **kwargs).logits[:, -width - 1 : -1]
    elif group is not None:
        logits = head[1](_shared_prompt_hidden(head[0], prompt_ids, prompt_mask, completion_ids,
                                               completion_mask, group))  # fmt: skip
    else:
        decoder, output = head
        hidden = decoder(input_ids=ids, **kwargs).last_hidden_state
        logits = output(hidden[:, -width - 1 : -1])
    logits = logits.float() / temperature
    picked = logits.gather(-1, completion_ids[..., None]).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def _shared_prompt_hidden(
    decoder: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    group: torch.Tensor,
) -> torch.Tensor:
    """The decoder's hidden states that predict each completion token ``[B, T, H]``: each
    distinct prompt runs once, its keys and values are indexed out to its group's rows (autograd
    sums their gradients back), and the completions run on that cache. A group of 8 completions
    of 16 tokens behind a 100-token prompt runs 228 positions instead of 928."""
    from transformers import DynamicCache

    first = _first_rows(group)
    cache = DynamicCache(config=decoder.config)
    # the cache is the fourth argument: named past_key_values, or cache from transformers 5.x
    prompt = decoder(
        prompt_ids[first], prompt_mask[first], _positions(prompt_mask[first]), cache,
        use_cache=True,
    ).last_hidden_state  # fmt: skip
    cache.batch_select_indices(group)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)
    width = completion_ids.shape[1]
    hidden = decoder(
        completion_ids, mask, _positions(mask)[:, -width:], cache, use_cache=True
    ).last_hidden_state
    return torch.cat([prompt[group, -1:], hidden[:, :-1]], dim=1)
