"""A chat tokenizer that exists offline: byte-level BPE with Llama-3-style special tokens.

No PyPI package ships a usable tokenizer (tiktoken downloads its encodings on first use), so the
offline LoRA default trains one: a byte-level BPE of ~2k tokens on the standard library's
docstrings (2-4 s once), with the special tokens and chat template of Llama 3, cached by content key.

Pad is a reserved special token (``<|finetune_right_pad_id|>``, as Llama 3.1+ reserves one), never
EOS and never an added token: adding tokens means resizing embeddings, which makes peft save whole
embedding matrices with every adapter (trl#1287).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from laptrain.families.classifier.stdlib_docstrings import collect_examples

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
START_HEADER, END_HEADER = "<|start_header_id|>", "<|end_header_id|>"
EOT = "<|eot_id|>"
PAD = "<|finetune_right_pad_id|>"
SPECIAL_TOKENS = [BOS, EOS, START_HEADER, END_HEADER, EOT, PAD]

# The Llama 3 Instruct template without its tool-calling and date blocks: every message is
# header + "\n\n" + trimmed content + <|eot_id|>; the generation prompt is the assistant header.
LLAMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)

# 64 source files, ~440k characters of docstrings: enough for a 2k vocabulary. Parsing them takes
# 1-3 s, training 0.4 s (measured on 2 shared cores).
CORPUS_MODULES = [
    "argparse", "bisect", "calendar", "cmd", "codecs", "collections", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "difflib", "dis", "enum", "fnmatch",
    "fractions", "functools", "getopt", "gettext", "glob", "gzip", "hashlib", "heapq", "hmac",
    "inspect", "ipaddress", "json", "logging", "mimetypes", "numbers", "operator", "optparse",
    "pathlib", "pickle", "pprint", "queue", "random", "sched", "secrets", "shlex", "shutil",
    "socket", "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap",
    "threading", "timeit", "tokenize", "typing", "uuid", "warnings", "weakref", "zipfile",
]  # fmt: skip
CACHE_VERSION = 1


def build_offline_tokenizer(
    texts: Iterable[str], vocab_size: int = 2048
) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on ``texts`` with Llama-3 special tokens and chat template.

    Byte-level: any text round-trips (no unknown token). BOS is written by the chat template, so the
    tokenizer itself adds no special tokens around plain text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOT, pad_token=PAD
    )
    tokenizer.chat_template = LLAMA3_CHAT_TEMPLATE
    return tokenizer


def prepare_chat_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Give a loaded tokenizer what chat fine-tuning needs, without adding tokens.

    No chat template: the Llama-3-style ``LLAMA3_CHAT_TEMPLATE`` (its header strings are then plain
    text unless the vocabulary has them). No pad token: ``<|finetune_right_pad_id|>`` when the
    vocabulary reserves it (Llama 3.1+), else EOS; labels are -100 on padding either way.
    """
    if not tokenizer.chat_template:
        tokenizer.chat_template = LLAMA3_CHAT_TEMPLATE
    if tokenizer.pad_token is None:
        reserved = tokenizer.convert_tokens_to_ids(PAD)
        has_reserved = reserved is not None and reserved != tokenizer.unk_token_id
        tokenizer.pad_token = PAD if has_reserved else tokenizer.eos_token
    return tokenizer


def _offline_key(vocab_size: int) -> str:
    spec = {
        "version": CACHE_VERSION,
        "python": sys.version,
        "modules": CORPUS_MODULES,
        "vocab_size": vocab_size,
        "special": SPECIAL_TOKENS,
        "template": LLAMA3_CHAT_TEMPLATE,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def offline_tokenizer_path(cache_dir: str | Path, vocab_size: int = 2048) -> Path:
    """Where ``offline_tokenizer`` keeps its ``save_pretrained`` folder (the key is in the name)."""
    return Path(cache_dir) / "tokenizers" / f"stdlib-bpe-{vocab_size}-{_offline_key(vocab_size)}"


def offline_tokenizer(cache_dir: str | Path, vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """The offline tokenizer: trained once on stdlib docstrings, then loaded from ``cache_dir``."""
    folder = offline_tokenizer_path(cache_dir, vocab_size)
    if not (folder / "tokenizer.json").is_file():
        rows = collect_examples({"all": CORPUS_MODULES})
        if not rows:
            raise FileNotFoundError(
                "no docstrings found in this Python's standard library (installed without its "
                "sources): set data.tokenizer=<a tokenizer folder or hub name>"
            )
        tokenizer = build_offline_tokenizer((r["text"] for r in rows), vocab_size)
        tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tokenizer.save_pretrained(str(tmp))
        if folder.exists():  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.rename(folder)
    return AutoTokenizer.from_pretrained(str(folder))
