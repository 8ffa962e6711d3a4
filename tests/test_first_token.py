"""The classifier's last layer computed for the first token only: same logits and gradients."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    RobertaConfig,
    RobertaForSequenceClassification,
)

from laptrain.families.classifier.first_token import first_token_only, supports_first_token
from laptrain.families.classifier.text_classifier import TextClassifierModule

SMALL = dict(
    vocab_size=120,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    pad_token_id=1,
)


def _batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 120, (4, 11), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # padded rows, as per-batch padding makes them
    mask[3, 2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 1, 0])}


def _pair(cls, config_cls, attn: str):
    torch.manual_seed(0)
    full = cls(config_cls(**SMALL, attn_implementation=attn))
    fast = copy.deepcopy(full)
    assert first_token_only(fast)
    return full, fast


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize(
    "cls, config_cls",
    [
        (BertForSequenceClassification, BertConfig),
        (RobertaForSequenceClassification, RobertaConfig),
    ],
)
def test_logits_loss_and_gradients_match_the_full_model(cls, config_cls, attn):
    full, fast = _pair(cls, config_cls, attn)
    batch = _batch()
    a, b = full.train()(**batch), fast.train()(**batch)
    assert torch.allclose(a.logits, b.logits, atol=1e-6)
    a.loss.backward()
    b.loss.backward()
    for (name, p), q in zip(full.named_parameters(), fast.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name
    # the last layer really is narrower: its output holds one position
    base = getattr(fast, fast.base_model_prefix)
    assert base(batch["input_ids"], batch["attention_mask"]).last_hidden_state.shape[1] == 1


def test_the_last_layer_is_checkpointed_too_and_gives_the_same_gradients():
    full, fast = _pair(BertForSequenceClassification, BertConfig, "sdpa")
    fast.gradient_checkpointing_enable()
    last = fast.bert.encoder.layer[-1]
    calls = []
    inner = last._gradient_checkpointing_func
    last._gradient_checkpointing_func = lambda *a, **k: calls.append(1) or inner(*a, **k)
    batch = _batch()
    full.train()(**batch).loss.backward()
    fast.train()(**batch).loss.backward()
    assert calls == [1]  # the replaced forward still goes through transformers' checkpointing
    for p, q in zip(full.parameters(), fast.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)


def test_other_heads_and_layers_are_left_alone():
    gpt2 = GPT2ForSequenceClassification(GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=50))
    assert not supports_first_token(gpt2) and not first_token_only(gpt2)
    chunked = BertForSequenceClassification(BertConfig(**SMALL, chunk_size_feed_forward=4))
    assert not first_token_only(chunked)
    assert "forward" not in chunked.bert.encoder.layer[-1].__dict__


def test_pickles_and_exports_as_plain_transformers(tmp_path):
    full, fast = _pair(BertForSequenceClassification, BertConfig, "sdpa")
    batch = _batch()
    expected = fast.eval()(**batch).logits
    again = pickle.loads(pickle.dumps(fast))  # ddp_spawn pickles the module
    assert torch.equal(again.eval()(**batch).logits, expected)
    fast.save_pretrained(tmp_path)
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert "forward" not in plain.bert.encoder.layer[-1].__dict__
    assert torch.allclose(plain(**batch).logits, expected, atol=1e-6)
    assert set(plain.state_dict()) == set(full.state_dict())


@pytest.mark.parametrize("on", [True, False])
def test_the_classifier_option(on):
    module = TextClassifierModule(
        num_labels=2,
        backbone={"model_type": "bert", **SMALL},
        last_layer_first_token=on,
    )
    assert module.first_token_only is on
    assert ("forward" in module.model.bert.encoder.layer[-1].__dict__) is on


def test_a_flex_attention_model_is_left_alone():
    """Its mask is a BlockMask, which has no rows to cut to the first query."""
    flex = BertForSequenceClassification(BertConfig(**SMALL, attn_implementation="flex_attention"))
    assert not supports_first_token(flex) and not first_token_only(flex)
    assert "forward" not in flex.bert.encoder.layer[-1].__dict__


@pytest.mark.slow  # ~10 s: flex attention's first compile on the CPU
def test_a_model_switched_to_flex_attention_runs_its_full_last_layer():
    """Before, the first-token layer called ``attention_mask.dim()`` on the BlockMask and failed.
    Without gradients: torch 2.13's flex attention has no backward on CPU."""
    full, fast = _pair(BertForSequenceClassification, BertConfig, "sdpa")
    for model in (full, fast):
        model.set_attn_implementation("flex_attention")
    batch = _batch()
    with torch.no_grad():
        expected = full.eval()(**batch).logits
        assert torch.allclose(fast.eval()(**batch).logits, expected, atol=1e-6)
