"""The offline tiny Llama: built once per content key, deterministic, usable as a LoRA base."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import laptrain.families.lora.tiny_llama as tiny
from laptrain.families.lora.causal_lm import CausalLMLoRAModule
from tests.test_causal_lm_lora import _one_thread, tokenizer  # noqa: F401 - module fixtures

SMALL = {"hidden_size": 32, "intermediate_size": 64, "steps": 30, "seq_len": 64, "batch_size": 4}


def test_built_once_deterministic_and_trained(tokenizer, tmp_path, monkeypatch):  # noqa: F811
    first = tiny.tiny_llama(tokenizer, tmp_path / "a", **SMALL)
    record = json.loads((first / "pretraining.json").read_text())
    assert record["last_loss"] < record["first_loss"] - 1.0
    config = json.loads((first / "config.json").read_text())
    assert config["initializer_range"] == 0.3 and config["vocab_size"] == len(tokenizer)
    assert (first / "tokenizer.json").is_file()

    second = tiny.tiny_llama(tokenizer, tmp_path / "b", **SMALL)  # same key, another cache
    assert second.name == first.name
    a = AutoModelForCausalLM.from_pretrained(str(first)).state_dict()
    b = AutoModelForCausalLM.from_pretrained(str(second)).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)

    def no_training(*args, **kwargs):
        raise AssertionError("pretrained again")

    monkeypatch.setattr(tiny, "pretrain", no_training)
    assert tiny.tiny_llama(tokenizer, tmp_path / "a", **SMALL) == first
    with pytest.raises(AssertionError, match="pretrained again"):  # another setting, another key
        tiny.tiny_llama(tokenizer, tmp_path / "a", **{**SMALL, "steps": 31})


def test_the_module_builds_its_base_from_tiny_base(tokenizer, tmp_path):  # noqa: F811
    module = CausalLMLoRAModule(
        tokenizer, tiny_base={"cache_dir": str(tmp_path), **SMALL}, lora={"r": 4}
    )
    # named by content, not by its cache path: a run folder moved to another machine resumes
    assert module.fingerprint["name"].startswith("folder (sha256 ")
    assert str(tmp_path) not in module.fingerprint["name"]
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert not any("lm_head" in n or "embed" in n for n in names)
