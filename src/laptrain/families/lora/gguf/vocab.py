"""A transformers byte-level BPE tokenizer as GGUF tokenizer metadata.

llama.cpp rebuilds the tokenizer from the file: the token strings by id, each token's type
(special tokens must be ``CONTROL`` or llama.cpp reads ``<|im_end|>`` in a prompt as text), the BPE
merges, and a pre-tokenizer *name* (``tokenizer.ggml.pre``) standing for the regex that splits text
before BPE. The name is chosen here from the pre-tokenizer the tokenizer actually runs, so
llama.cpp splits text as the fine-tune saw it; a pre-tokenizer not in :data:`PRE_TOKENIZERS` is
refused in one line rather than written as llama.cpp's default, which tokenizes differently.
"""

from __future__ import annotations

import json
from typing import Any

# The Llama 3 split pattern (transformers' tokenizer.json for Llama 3.x), case-folded contractions.
LLAMA3_SPLIT = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 3, 4


def _byte_level(step: dict[str, Any], use_regex: bool) -> bool:
    return step.get("type") == "ByteLevel" and bool(step.get("use_regex", True)) == use_regex


def pre_tokenizer_name(pre: dict[str, Any] | None) -> str | None:
    """llama.cpp's name for ``pre`` (tokenizer.json's ``pre_tokenizer``), or None if unknown.

    - ByteLevel with its GPT-2 regex -> ``gpt-2`` (the offline tokenizer; SmolLM2 as transformers
      reads it back from a GGUF);
    - per-digit split, then ByteLevel with the GPT-2 regex -> ``smollm`` (SmolLM2's own tokenizer);
    - the Llama 3 split, then ByteLevel without a regex -> ``llama-bpe`` (Llama 3.x).
    """
    if not pre:
        return None
    if _byte_level(pre, True):
        return "gpt-2"
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return None
    first, second = steps
    if (
        first.get("type") == "Digits"
        and first.get("individual_digits")
        and _byte_level(second, True)
    ):
        return "smollm"
    if (
        first.get("type") == "Split"
        and (first.get("pattern") or {}).get("Regex") == LLAMA3_SPLIT
        and first.get("behavior") == "Isolated"
        and not first.get("invert")
        and _byte_level(second, False)
    ):
        return "llama-bpe"
    return None


def _merges(model: dict[str, Any]) -> list[str]:
    return [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]


def _adds(tokenizer: Any) -> tuple[bool, bool]:
    """Whether encoding plain text puts ``bos``/``eos`` around it (as llama.cpp must too)."""
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    bos = len(full) > len(bare) and full[0] == tokenizer.bos_token_id
    eos = len(full) > len(bare) and full[-1] == tokenizer.eos_token_id
    return bos, eos


def check_tokenizer(tokenizer: Any) -> tuple[dict[str, Any], str]:
    """tokenizer.json as a dict and llama.cpp's pre-tokenizer name; ValueError (one line) for a
    tokenizer llama.cpp would not rebuild as it is."""
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    model = data["model"]
    if (
        model.get("type") != "BPE"
        or model.get("byte_fallback")
        or ((data.get("decoder") or {}).get("type") != "ByteLevel")
    ):
        raise ValueError(
            "--format gguf writes byte-level BPE tokenizers (SmolLM2, Llama 3.x, laptrain's "
            "offline tokenizer) only; this run's tokenizer is not one"
        )
    pre = pre_tokenizer_name(data.get("pre_tokenizer"))
    if pre is None:
        raise ValueError(
            "this tokenizer's pre-tokenizer is not one llama.cpp names (gpt-2, smollm, llama-bpe "
            "are written): llama.cpp would split text differently from training, so no GGUF is "
            "written; export a transformers folder instead (without --format gguf)"
        )
    return data, pre


def add_tokenizer(writer: Any, tokenizer: Any, vocab_size: int, end_of_turn: str | None) -> None:
    """Write the tokenizer keys for ``tokenizer`` (a transformers fast tokenizer) padded to the
    model's ``vocab_size`` rows with unused tokens, as llama.cpp needs one token per row."""
    data, pre = check_tokenizer(tokenizer)
    model = data["model"]
    by_id: dict[int, str] = {i: t for t, i in model["vocab"].items()}
    types = dict.fromkeys(by_id, TOKEN_NORMAL)
    for added in data.get("added_tokens", []):
        by_id[added["id"]] = added["content"]
        types[added["id"]] = TOKEN_CONTROL if added.get("special") else TOKEN_USER_DEFINED
    count = max(vocab_size, max(by_id) + 1)
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(count)]
    token_types = [types.get(i, TOKEN_USER_DEFINED) for i in range(count)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(_merges(model))
    for kind in ("bos", "eos", "unk", "pad"):
        token_id = getattr(tokenizer, f"{kind}_token_id", None)
        if token_id is not None:
            getattr(writer, f"add_{kind}_token_id")(int(token_id))
    if end_of_turn is not None:
        eot = tokenizer.convert_tokens_to_ids(end_of_turn)
        if eot is not None and eot != tokenizer.unk_token_id and eot != tokenizer.eos_token_id:
            writer.add_eot_token_id(int(eot))
    add_bos, add_eos = _adds(tokenizer)
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(add_eos)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)
