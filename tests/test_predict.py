"""laptrain.families.classifier.predict: a classifier run's exported model labels texts as transformers alone would."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import yaml

from laptrain.families.classifier.predict import Classifier, read_texts, write_predictions
from laptrain.families.classifier.tiny_bert import tiny_bert_classifier
from laptrain.families.classifier.tokenizer import train_wordpiece
from tests.conftest import WORDS

LABELS = sorted(WORDS)
TEXTS = ["the team won the match", "bake the dough in the oven", "storm and rain " * 40, "goal"]


def export_run(folder: Path, max_length: int = 16) -> Path:
    """What a finished classifier run leaves (run.py's export, the datamodule's save_artifacts)."""
    torch.manual_seed(0)
    model = tiny_bert_classifier(
        num_labels=3,
        id2label=dict(enumerate(LABELS)),
        label2id={n: i for i, n in enumerate(LABELS)},
    )
    model.save_pretrained(str(folder / "model"))
    tokenizer = train_wordpiece([w for words in WORDS.values() for w in words.split()], 256)
    tokenizer.save_pretrained(str(folder / "tokenizer"))
    (folder / "labels.json").write_text(json.dumps(LABELS))
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "config.yaml").write_text(
        yaml.safe_dump({"data": {"max_length": max_length}})
    )
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["run_name=r"]))
    return folder


def test_predictions_match_transformers_alone_in_any_batch_size(tmp_path):
    run = export_run(tmp_path / "r")
    classifier = Classifier(run)
    assert classifier.max_length == 16  # the run's data.max_length
    one_by_one = classifier.predict(TEXTS, batch_size=1)
    batched = classifier.predict(TEXTS, batch_size=32)
    assert [p.label for p in one_by_one] == [p.label for p in batched]
    for a, b in zip(one_by_one, batched):
        assert abs(a.probability - b.probability) < 1e-5
        assert 1 / 3 <= a.probability <= 1
    # the same folders through transformers' Auto classes, no laptrain code
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(str(run / "model")).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(run / "tokenizer"))
    for text, prediction in zip(TEXTS, batched):
        batch = tokenizer(text, truncation=True, max_length=16, return_tensors="pt")
        with torch.no_grad():
            probs = model(**batch).logits.softmax(-1)[0]
        assert model.config.id2label[int(probs.argmax())] == prediction.label
        assert abs(float(probs.max()) - prediction.probability) < 1e-5


def test_csv_in_and_out_keep_the_rows(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text('id,body\n1,"win, the match"\n2,oven\n')
    rows, texts = read_texts(path, "body")
    assert texts == ["win, the match", "oven"]
    classifier = Classifier(export_run(tmp_path / "r"))
    write_predictions(tmp_path / "out.csv", rows, classifier.predict(texts))
    with (tmp_path / "out.csv").open(newline="") as f:
        written = list(csv.DictReader(f))
    assert [r["id"] for r in written] == ["1", "2"] and written[0]["body"] == "win, the match"
    assert all(r["predicted_label"] in LABELS and 0 < float(r["probability"]) <= 1 for r in written)
    with pytest.raises(ValueError, match=r"no column 'text' \(columns: id, body\).*--column"):
        read_texts(path, "text")


def test_bad_folders_are_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="no run folder .*laptrain runs"):
        Classifier(tmp_path / "missing")
    (tmp_path / "trm" / "checkpoints").mkdir(parents=True)
    with pytest.raises(ValueError, match="not a text classifier run"):
        Classifier(tmp_path / "trm")
    unfinished = export_run(tmp_path / "r")
    for part in (unfinished / "model").iterdir():
        part.unlink()
    (unfinished / "model").rmdir()
    with pytest.raises(
        ValueError, match="the run has not finished; rerun to finish it: python train.py run_name=r"
    ):
        Classifier(unfinished)


@pytest.mark.parametrize("size", ["-1", "0"])
def test_a_batch_size_below_one_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, size):
    """`--batch-size -1` made no batch at all: nothing predicted, nothing written, exit 0; now
    the option refuses it in one line, and so does the Python API."""
    from laptrain.commands import cli

    run, out = export_run(tmp_path / "r"), tmp_path / "out.csv"
    capsys.readouterr()  # save_pretrained's bars
    # refused by the option's argparse type, before the model is loaded
    with pytest.raises(SystemExit) as stop:
        cli.main(["predict", str(run), "the team won", "--batch-size", size, "--out", str(out)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and not out.exists()
    assert f"argument --batch-size: '{size}' is not a whole number >= 1" in err.splitlines()[-1]
    with pytest.raises(ValueError, match="must be a whole number >= 1"):
        Classifier(run).predict(TEXTS, batch_size=-1)


def test_the_batch_size_argparse_type_refuses_below_one_with_exit_2(capsys):
    import argparse

    from laptrain.families.classifier.predict import batch_size_arg

    parser = argparse.ArgumentParser(prog="laptrain predict")
    parser.add_argument("--batch-size", type=batch_size_arg, default=32)
    assert parser.parse_args(["--batch-size", "8"]).batch_size == 8
    for bad in ("-1", "0", "two"):
        with pytest.raises(SystemExit) as stop:
            parser.parse_args(["--batch-size", bad])
        assert stop.value.code == 2
        assert f"{bad!r} is not a whole number >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "json", "parquet"])
def test_predict_file_reads_every_format_training_reads(tmp_path, capsys, fmt):
    """``laptrain predict --file`` reads a file with the data module's reader
    (labelled_files.read_table): the rows and texts are the same in every format."""
    from laptrain.commands import cli

    records = [{"id": 1, "text": "the team won the match"}, {"id": 2, "text": "bake the bread"}]
    path = tmp_path / f"in.{fmt}"
    if fmt in ("csv", "tsv"):
        sep = "," if fmt == "csv" else "\t"
        path.write_text(
            "".join(f"{r['id']}{sep}{r['text']}\n" for r in records).join([f"id{sep}text\n", ""])
        )
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif fmt == "json":
        path.write_text(json.dumps(records))
    else:
        import pandas as pd

        pd.DataFrame(records).to_parquet(path)
    rows, texts = read_texts(path, "text")
    assert texts == ["the team won the match", "bake the bread"]
    assert [str(r["id"]) for r in rows] == ["1", "2"]
    run, out = export_run(tmp_path / "r"), tmp_path / "out.csv"
    capsys.readouterr()
    assert cli.main(["predict", str(run), "--file", str(path), "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"2 predictions written to {out}\n"
    with out.open(newline="") as f:
        written = list(csv.DictReader(f))
    assert [(r["id"], r["text"]) for r in written] == [("1", texts[0]), ("2", texts[1])]
    assert all(r["predicted_label"] in LABELS for r in written)
