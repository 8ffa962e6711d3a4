"""One tiny BERT, a few hundred thousand parameters: the doctor's training check, the device smoke
test and the tests all build it from here, so they exercise the same shape.

``TINY_BERT`` is the ``model.backbone`` mapping (``TextClassifierModule(backbone=...)``); the two
builders give the transformers config and a ready ``BertForSequenceClassification``. Each takes
field overrides (``vocab_size``, ``num_hidden_layers``, ``max_position_embeddings``...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # transformers is heavy; import it only when a model is built
    from transformers import BertConfig, BertForSequenceClassification

TINY_BERT: dict[str, Any] = {
    "model_type": "bert",
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
}


def tiny_bert_backbone(**overrides: Any) -> dict[str, Any]:
    """The ``model.backbone`` mapping of the tiny BERT, with ``overrides`` applied."""
    return {**TINY_BERT, **overrides}


def tiny_bert_config(**overrides: Any) -> BertConfig:
    """The tiny BERT's ``BertConfig`` (vocabulary 256 unless overridden)."""
    from transformers import BertConfig

    fields = {k: v for k, v in tiny_bert_backbone(**overrides).items() if k != "model_type"}
    return BertConfig(**{"vocab_size": 256, **fields})


def tiny_bert_classifier(num_labels: int = 2, **overrides: Any) -> BertForSequenceClassification:
    """A freshly initialised tiny BERT classifier (seed torch first for the same weights)."""
    from transformers import BertForSequenceClassification

    return BertForSequenceClassification(tiny_bert_config(num_labels=num_labels, **overrides))
