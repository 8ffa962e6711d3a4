"""Run a BERT-style classifier's last encoder layer for the first token only.

A sequence classifier in the BERT family reads one position of the last layer: BERT's pooler and
RoBERTa's head both take ``hidden_states[:, 0]``. Yet transformers computes every position of that
layer, and most of a layer's work is per position: the query, the attention output, the two
feed-forward matrices. Only the keys and values need every position. So the last layer here
computes keys and values for all positions and everything else for the first one: the logits are
those of the full model (to float rounding; ``tests/test_first_token.py``), and a 6-layer model
such as all-MiniLM-L6-v2 does about a seventh less matmul work per step (docs/speed.md measures it).

Gap filled: transformers has no option for it (a classifier's forward always returns the whole
``last_hidden_state``), and neither has Lightning. The layer keeps its modules and parameter
names; only the instance's ``forward`` is replaced, so ``save_pretrained``, checkpoints and
gradient checkpointing see the model unchanged, and an exported model is plain transformers.
Models whose structure differs (cross-attention, chunked feed-forward, another head) are left
as they are, and so are models set to flex attention: their mask is a ``BlockMask``
(``torch.nn.attention.flex_attention``), a block-sparse description of the whole
query-by-key grid and not a tensor whose rows can be cut to the first query. A model switched to
flex attention after this was applied (``set_attn_implementation``) runs its full last layer.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

# Classifier heads that read position 0 of the last layer, and only it.
FIRST_TOKEN_HEADS = ("BertForSequenceClassification", "RobertaForSequenceClassification")


def _last_layer(model: nn.Module) -> nn.Module | None:
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    layers = getattr(getattr(base, "encoder", None), "layer", None)
    return layers[-1] if isinstance(layers, nn.ModuleList) and len(layers) else None


def supports_first_token(model: nn.Module) -> bool:
    """Whether ``model`` is a classifier this applies to: a head of :data:`FIRST_TOKEN_HEADS`
    over a BERT-style encoder layer with self-attention only and an unchunked feed-forward."""
    if type(model).__name__ not in FIRST_TOKEN_HEADS:
        return False
    config = model.config
    if config.is_decoder or getattr(config, "add_cross_attention", False):
        return False
    if getattr(config, "chunk_size_feed_forward", 0):
        return False
    if getattr(config, "_attn_implementation", None) == "flex_attention":
        return False  # a BlockMask mask (module doc)
    layer = _last_layer(model)
    attention = getattr(layer, "attention", None)
    return all(
        hasattr(module, name)
        for module, names in (
            (attention, ("self", "output")),
            (getattr(attention, "self", None), ("query", "key", "value", "scaling", "dropout")),
            (layer, ("feed_forward_chunk",)),
        )
        for name in names
    )


def first_token_only(model: nn.Module) -> bool:
    """Make ``model``'s last encoder layer compute the first position only (module doc).
    Returns whether it did; a model it does not apply to is left unchanged."""
    if not supports_first_token(model):
        return False
    layer = _last_layer(model)
    # a partial of a module-level function, not a bound method: the model still pickles (ddp_spawn)
    layer.forward = partial(_first_token_forward, layer)
    return True


def _attention_function(module: nn.Module) -> Any:
    """The attention kernel the model is configured with (eager, sdpa, ...), as transformers
    picks it in the layer's own forward."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.bert.modeling_bert import eager_attention_forward

    return ALL_ATTENTION_FUNCTIONS.get_interface(
        module.config._attn_implementation, eager_attention_forward
    )


def _first_token_forward(
    layer: nn.Module,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    """Checkpointed as transformers checkpoints the layer's own forward: transformers 5 wraps the
    class's ``forward`` (``GradientCheckpointingLayer.__init_subclass__``, modeling_layers.py),
    which this instance's ``forward`` replaces, so the same ``_gradient_checkpointing_func`` (and
    laptrain's MPS generator replay around it) is called here. A mask that is not a tensor (flex
    attention's ``BlockMask``) goes to the layer's own forward, all positions."""
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        return type(layer).forward(layer, hidden_states, attention_mask, *args, **kwargs)
    if (
        getattr(layer, "gradient_checkpointing", False)
        and layer.training
        and torch.is_grad_enabled()
    ):
        return layer._gradient_checkpointing_func(
            partial(_first_token_layer, layer, **kwargs), hidden_states, attention_mask, *args
        )
    return _first_token_layer(layer, hidden_states, attention_mask, *args, **kwargs)


def _first_token_layer(
    layer: nn.Module,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    """The layer's forward for position 0: shape ``(batch, 1, hidden)``."""
    attention = layer.attention.self
    batch, length, _ = hidden_states.shape
    heads, size = attention.num_attention_heads, attention.attention_head_size
    first = hidden_states[:, :1]
    query = attention.query(first).view(batch, 1, heads, size).transpose(1, 2)
    key = attention.key(hidden_states).view(batch, length, heads, size).transpose(1, 2)
    value = attention.value(hidden_states).view(batch, length, heads, size).transpose(1, 2)
    if attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[-2] > 1:
        attention_mask = attention_mask[:, :, :1, :]
    context, _ = _attention_function(attention)(
        attention,
        query,
        key,
        value,
        attention_mask,
        dropout=attention.dropout.p if attention.training else 0.0,
        scaling=attention.scaling,
    )
    context = context.reshape(batch, 1, -1).contiguous()
    return layer.feed_forward_chunk(layer.attention.output(context, first))
