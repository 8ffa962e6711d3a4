"""Predictions of a finished classifier run, read from its exported folders (an ONNX export:
``onnx_predict``).

A run of a text classifier leaves ``model/`` (``save_pretrained``), ``tokenizer/`` and
``labels.json``: transformers' Auto classes load them without laptrain. This module is that
loading plus the run's truncation length, batching and one-line errors, for ``laptrain predict``,
the classifier family's command (its ``FAMILY.commands``): :func:`add_commands` declares its
arguments, ``COMMANDS`` maps it to :func:`predict`, and ``laptrain/commands/cli.py`` adds it.
"""

from __future__ import annotations

import argparse
import csv
import inspect
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from laptrain.commands.arguments import RUN, add_run_argument
from laptrain.run_folder.listing import resolve_run, resume_command

from .onnx_predict import OnnxClassifier, is_onnx_export
from .prediction import Prediction, check_batch_size


def _max_length(run: Path, tokenizer_dir: Path) -> int | None:
    """The truncation length the run trained with (``data.max_length``), where it is recorded."""
    import yaml

    for path, keys in (
        (run / ".hydra" / "config.yaml", ("data", "max_length")),
        (tokenizer_dir / "tokenizer_config.json", ("max_length",)),
    ):
        try:
            value: Any = yaml.safe_load(path.read_text()) if path.is_file() else None
        except (OSError, yaml.YAMLError):
            continue
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, int):
            return value
    return None


def _not_finished(run: Path) -> ValueError:
    command = resume_command(run)
    rerun = f": {command}" if command else " with the command that started it"
    return ValueError(
        f"{run} has no exported model yet: the run has not finished; rerun to finish it{rerun}"
    )


def batch_size_arg(text: str) -> int:
    """``argparse`` type of ``laptrain predict --batch-size``: an int >= 1 (argparse then exits 2
    with its usage line and this message)."""
    try:
        return check_batch_size(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number >= 1 (e.g. --batch-size 32)"
        ) from None


class Classifier:
    """The exported model, tokenizer and label names of a classifier run folder.

    Raises:
        ValueError: with one line when the folder is missing, is not a classifier run, or has not
            exported its model yet.
    """

    def __init__(self, run: str | Path) -> None:
        run = Path(run)
        if not run.is_dir():
            raise ValueError(
                f"no run folder {run}: give a folder such as outputs/<run> (`laptrain runs` lists them)"
            )
        config_path = run / "model" / "config.json"
        if not config_path.is_file():
            if (run / "labels.json").is_file():
                raise _not_finished(run)
            raise ValueError(
                f"{run} is not a text classifier run (no model/ or labels.json): laptrain predict "
                "reads runs of model=tiny_classifier or model=scibert (LoRA runs: laptrain generate)"
            )
        architectures = json.loads(config_path.read_text()).get("architectures") or []
        if not any(str(a).endswith("ForSequenceClassification") for a in architectures):
            raise ValueError(
                f"{run}/model is a {', '.join(architectures) or 'model'} checkpoint, not a sequence "
                "classifier: laptrain predict reads text classifier runs"
            )
        if not (run / "tokenizer").is_dir():
            raise _not_finished(run)
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.model = AutoModelForSequenceClassification.from_pretrained(str(run / "model")).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(run / "tokenizer"))
        labels_path = run / "labels.json"
        id2label = self.model.config.id2label
        self.labels: list[str] = (
            json.loads(labels_path.read_text())
            if labels_path.is_file()
            else [id2label[i] for i in range(len(id2label))]
        )
        self.max_length = _max_length(run, run / "tokenizer") or int(
            getattr(self.model.config, "max_position_embeddings", 512)
        )

    def predict(self, texts: Sequence[str], batch_size: int = 32) -> list[Prediction]:
        """The most probable label of each text and its softmax probability.

        Raises:
            ValueError: one line, when ``batch_size`` is not an int >= 1 (``range`` would make
                no batch of a negative size, and so no prediction at all).
        """
        check_batch_size(batch_size)
        import torch

        out: list[Prediction] = []
        accepted = set(inspect.signature(self.model.forward).parameters)
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                batch = self.tokenizer(
                    list(texts[start : start + batch_size]),
                    truncation=True,
                    max_length=self.max_length,
                    padding=True,
                    return_tensors="pt",
                )
                inputs = {k: v for k, v in batch.items() if k in accepted}
                probs = self.model(**inputs).logits.softmax(-1)
                top = probs.max(-1)
                out += [
                    Prediction(self.labels[int(i)], float(p))
                    for p, i in zip(top.values, top.indices)
                ]
        return out


def read_texts(path: str | Path, column: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of a data file and the texts in ``column``; one-line errors. Every format
    training reads (CSV, TSV, JSON, JSONL, Parquet, by suffix), through the data module's own
    reader (:func:`laptrain.data.tables.read_table`)."""
    from laptrain.data.tables import read_table

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--file {path}: no such file")
    table = read_table(path)
    if column not in table.columns:
        raise ValueError(
            f"{path} has no column {column!r} (columns: {', '.join(table.columns)}): "
            "name the text column with --column <name>"
        )
    rows = [dict(record) for _, record in table.rows]
    return rows, ["" if row.get(column) is None else str(row[column]) for row in rows]


def write_predictions(
    path: str | Path, rows: list[dict[str, Any]], predictions: list[Prediction]
) -> None:
    """``rows`` with ``predicted_label`` and ``probability`` columns added, as CSV."""
    fields = list(dict.fromkeys(key for row in rows for key in row))  # JSON rows may differ
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=[*fields, "predicted_label", "probability"])
        writer.writeheader()
        for row, p in zip(rows, predictions):
            writer.writerow(
                {**row, "predicted_label": p.label, "probability": f"{p.probability:.4f}"}
            )


def predict(args: argparse.Namespace) -> int:
    """Print (or write with ``--out``) the label and probability of each text."""
    from laptrain.console import no_transformers_bars

    try:
        if bool(args.texts) == bool(args.file):
            raise ValueError('give texts ("some text" ...) or --file <file>, not both or neither')
        rows, texts = read_texts(args.file, args.column) if args.file else ([], args.texts)
        run = resolve_run(args.run, args.root, any_folder=True)
        if is_onnx_export(run):  # laptrain export --format onnx: no torch
            classifier: Classifier | OnnxClassifier = OnnxClassifier(run)
        else:
            with no_transformers_bars():
                classifier = Classifier(run)
        predictions = classifier.predict(texts, args.batch_size)
        if args.out:
            if not args.file:
                rows = [{"text": t} for t in texts]
            write_predictions(args.out, rows, predictions)
            print(f"{len(predictions)} predictions written to {args.out}")
            return 0
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for text, p in zip(texts, predictions):
        short = " ".join(text.split())
        print(f"{p.label}\t{p.probability:.3f}\t{short[:70] + ('…' if len(short) > 70 else '')}")
    return 0


def add_commands(commands: Any) -> None:
    """``laptrain predict`` in the CLI's parser."""
    pred = commands.add_parser(
        "predict", help="label texts with a finished classifier run's exported model"
    )
    add_run_argument(
        pred, f"a finished classifier run: {RUN}; or its `laptrain export --format onnx` folder"
    )
    pred.add_argument("texts", nargs="*", help="texts to label (or --file)")
    pred.add_argument(
        "--file",
        help="a file of texts instead: CSV, TSV, JSON, JSONL or Parquet, read as training reads "
        "data files (default: the texts given)",
    )
    pred.add_argument("--column", default="text", help="the text column of --file")
    pred.add_argument(
        "--out",
        help="write a CSV: the rows plus predicted_label and probability (default: print a "
        "label, probability and text line per text)",
    )
    pred.add_argument(
        "--batch-size", type=batch_size_arg, default=32, help="texts per forward pass"
    )


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"predict": predict}
