"""The offline chat tokenizer: trained on stdlib docstrings in seconds, cached, Llama-3 shaped."""

from __future__ import annotations

import time

from transformers import PreTrainedTokenizerFast

from laptrain.families.lora import chat_tokenizer
from laptrain.families.lora.chat_tokenizer import (
    LLAMA3_CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    build_offline_tokenizer,
    offline_tokenizer,
    prepare_chat_tokenizer,
)


def test_offline_tokenizer_builds_in_seconds_is_llama3_shaped_and_is_cached(tmp_path, monkeypatch):
    start = time.perf_counter()
    tok = offline_tokenizer(tmp_path)
    assert time.perf_counter() - start < 20  # about 1-3 s; generous for 2 shared cores
    assert isinstance(tok, PreTrainedTokenizerFast) and len(tok) == 2048
    text = "Return the list of `os.path` entries (héllo, 🙂)\n\n  indented"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    for token in SPECIAL_TOKENS:
        assert tok.convert_tokens_to_ids(token) is not None
        assert tok(token, add_special_tokens=False)["input_ids"] == [
            tok.convert_tokens_to_ids(token)
        ]
    assert tok.bos_token == "<|begin_of_text|>" and tok.eos_token == "<|eot_id|>"
    assert tok.pad_token == "<|finetune_right_pad_id|>" and tok.pad_token_id != tok.eos_token_id
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert tok.apply_chat_template(chat, tokenize=False) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nhello<|eot_id|>"
    )
    prompt = tok.apply_chat_template(chat[:1], add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")

    def boom(*a, **k):
        raise AssertionError("trained again")

    monkeypatch.setattr(chat_tokenizer, "build_offline_tokenizer", boom)
    again = offline_tokenizer(tmp_path)
    assert again.get_vocab() == tok.get_vocab() and again.chat_template == tok.chat_template


def test_a_tokenizer_without_template_or_pad_gets_the_fallbacks_without_new_tokens():
    tok = build_offline_tokenizer(["alpha beta gamma"] * 4, vocab_size=300)
    size = len(tok)
    tok.chat_template = None
    tok.pad_token = None
    prepare_chat_tokenizer(tok)
    assert tok.chat_template == LLAMA3_CHAT_TEMPLATE
    assert tok.pad_token == "<|finetune_right_pad_id|>" and len(tok) == size
