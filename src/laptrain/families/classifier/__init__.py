"""The text-classifier family: a transformers sequence classifier (``text_classifier``), the tiny
BERT built from random weights for the default job (``tiny_bert``), the labelled-text datamodule
(``text_classification``), its tokenizers (``tokenizer``, also LoRA's), the offline stdlib
docstrings corpus (``stdlib_docstrings``), ``laptrain predict`` (``predict``; ``onnx_predict`` for
an ONNX export), ``laptrain export --format onnx`` (``onnx_export``) and the smoke build
(``smoke``)."""

from __future__ import annotations

from typing import Any

from laptrain.family import Family, FileRules


def _file_rules(datamodule: str) -> FileRules | None:
    if datamodule != "TextClassificationDataModule":
        return None
    from .labelled_files import LABELLED_OPTIONS, read_labelled

    return FileRules(LABELLED_OPTIONS, read_labelled)


def transformers_fsdp_layers(module: Any) -> set[type]:
    """The FSDP units of a transformers model's layers (the LoRA family's too)."""
    from laptrain.model.fsdp_units import transformers_layers

    return transformers_layers(module)


def _commands() -> Any:
    from . import predict

    return predict


def _exports() -> Any:
    from . import onnx_export

    return onnx_export


def _smoke() -> Any:
    from . import smoke

    return smoke


FAMILY = Family(
    name="classifier",
    summary="a transformers encoder with a classification head (tiny BERT, MiniLM, SciBERT)",
    file_rules=_file_rules,
    fsdp_layers=transformers_fsdp_layers,
    commands=_commands,
    exports=_exports,
    smoke=_smoke,
)
