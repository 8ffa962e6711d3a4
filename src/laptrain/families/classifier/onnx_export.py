"""``laptrain export RUN --format onnx`` of a classifier run (the family's ``FAMILY.exports``):
``model.onnx`` (the token ids and mask in, ``logits`` out, batch and length dynamic) from the
run's exported ``model/`` (the best checkpoint's weights, what ``laptrain predict`` reads), with
``tokenizer/`` (its truncation length recorded) and ``labels.json`` beside it, so that
``laptrain predict DIR`` labels texts with onnxruntime and ``tokenizers`` alone."""

from __future__ import annotations

import argparse
import inspect
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from laptrain.commands.export_folder import export_target
from laptrain.commands.onnx_export import check_onnx, default_out, write_onnx

# two lengths, so that the example has padding and a batch of two
EXAMPLE_TEXTS = ["a short text", "a longer text, with a few more words to give it a mask"]


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """The classifier's onnx export takes only ``laptrain export``'s own options."""


def _write(classifier: Any, run: Path, quant: str | None, folder: Path) -> float:
    import torch

    class Logits(torch.nn.Module):
        """The sequence classifier with its logits as the one output."""

        def __init__(self) -> None:
            super().__init__()
            self.classifier = classifier.model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
            return self.classifier(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).logits

    batch = classifier.tokenizer(EXAMPLE_TEXTS, padding=True, return_tensors="pt")
    accepted = set(inspect.signature(Logits.forward).parameters)
    inputs = {k: v for k, v in batch.items() if k in accepted}
    differs = write_onnx(Logits(), inputs, folder, quant, output_names=["logits"])
    shutil.copytree(run / "tokenizer", folder / "tokenizer")
    settings = folder / "tokenizer" / "tokenizer_config.json"
    config = json.loads(settings.read_text()) if settings.is_file() else {}
    settings.write_text(json.dumps({**config, "max_length": classifier.max_length}, indent=1))
    (folder / "labels.json").write_text(json.dumps(classifier.labels, indent=1))
    return differs


def export_onnx(args: argparse.Namespace) -> int:
    """``model.onnx``, ``tokenizer/`` and ``labels.json`` of a classifier run."""
    check_onnx(args.quant)
    from laptrain.console import no_transformers_bars, quiet_libraries

    from .predict import Classifier

    quiet_libraries()
    run: Path = args.path
    with no_transformers_bars():
        classifier = Classifier(run)
    out = args.out or default_out(run, args.quant)
    differs: list[float] = []
    target = export_target(out, "onnx", (run / "model", run / "tokenizer"), args.force)
    target.write(lambda folder: differs.append(_write(classifier, run, args.quant, folder)))
    print(f"ONNX written to {out} (max |Δ logit| vs torch on an example: {differs[0]:.2g})")
    print(f'labels: laptrain predict {out} "some text"')
    return 0


FORMATS: dict[str, Callable[[argparse.Namespace], int]] = {"onnx": export_onnx}
