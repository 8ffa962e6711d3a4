import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from laptrain.families.classifier import text_classification
from laptrain.families.classifier.text_classification import TextClassificationDataModule
from tests.conftest import write_texts


def module(tmp_path, **kw):
    kw.setdefault("files", {"train": str(write_texts(tmp_path / "t.csv"))})
    return TextClassificationDataModule(
        vocab_size=200, max_length=32, batch_size=8, cache_dir=str(tmp_path / "c"), **kw
    )


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_each_file_format_gives_the_same_splits_and_labels(tmp_path, fmt):
    path = write_texts(tmp_path / f"t.{fmt}", fmt=fmt)
    dm = module(tmp_path, files={"train": str(path)})
    dm.setup()
    assert dm.label_names == ["cooking", "sports", "weather"]
    sizes = {k: len(v) for k, v in dm.splits.items()}
    assert sizes == {"train": 192, "val": 24, "test": 24}
    kwargs = dm.model_kwargs()
    assert kwargs["num_labels"] == 3 and kwargs["vocab_size"] <= 200


def test_tokenized_data_is_cached_and_a_second_run_skips_the_work(tmp_path, monkeypatch):
    module(tmp_path).setup()

    def boom(*a, **k):
        raise AssertionError("tokenizer trained again")

    monkeypatch.setattr(text_classification, "train_wordpiece", boom)
    dm = module(tmp_path)
    dm.setup()
    assert len(dm.splits["train"]) == 192
    # a different max length is a different cache entry
    with pytest.raises(AssertionError, match="trained again"):
        TextClassificationDataModule(
            files=dm.files, vocab_size=200, max_length=16, cache_dir=str(tmp_path / "c")
        ).setup()


def test_batches_are_padded_to_their_own_longest_not_max_length(tmp_path):
    dm = module(tmp_path)
    dm.setup()
    widths = [b["input_ids"].shape[1] for b in dm.val_dataloader()]
    assert max(widths) <= 32 and min(widths) < max(widths)
    for batch in dm.train_dataloader():
        assert batch["attention_mask"][:, -1].any()  # no all-pad column


def test_given_splits_are_kept(tmp_path):
    files = {
        "train": str(write_texts(tmp_path / "a.csv", seed=1)),
        "validation": str(write_texts(tmp_path / "b.csv", rows=30, seed=2)),
        "test": str(write_texts(tmp_path / "c.csv", rows=21, seed=3)),
    }
    dm = module(tmp_path, files=files)
    dm.setup()
    assert (len(dm.splits["val"]), len(dm.splits["test"])) == (30, 21)


def test_a_split_set_to_null_is_split_off_train(tmp_path):
    files = {"train": str(write_texts(tmp_path / "a.csv")), "validation": None, "test": None}
    dm = module(tmp_path, files=files)
    dm.setup()
    assert {k: len(v) for k, v in dm.splits.items()} == {"train": 192, "val": 24, "test": 24}


def test_label_names_fix_the_order(tmp_path):
    dm = module(tmp_path, label_names=["weather", "sports", "cooking"])
    dm.setup()
    assert dm.label_names == ["weather", "sports", "cooking"]


def test_missing_file_and_missing_column_name_the_option(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data\.files\.train="):
        module(tmp_path, files={"train": str(tmp_path / "nope.csv")}).setup()
    with pytest.raises(ValueError, match=r"columns: text, label.*data\.label_column="):
        module(tmp_path, label_column="stars").setup()


def test_artifacts_keep_tokenizer_and_labels_with_the_run(tmp_path):
    dm = module(tmp_path)
    dm.setup()
    dm.save_artifacts(tmp_path / "run")
    assert (tmp_path / "run" / "labels.json").read_text().count("sports") == 1
    assert (tmp_path / "run" / "tokenizer" / "tokenizer.json").is_file()


def test_integer_labels_index_label_names_and_unknown_labels_are_refused(tmp_path):
    rows = "text,label\n" + "".join(f"word{i} text here,{i % 2}\n" for i in range(40))
    (tmp_path / "ints.csv").write_text(rows)
    dm = module(tmp_path, files={"train": str(tmp_path / "ints.csv")}, label_names=["neg", "pos"])
    dm.setup()
    assert dm.label_names == ["neg", "pos"] and set(dm.splits["train"]["labels"]) == {0, 1}
    with pytest.raises(ValueError, match="not in data.label_names"):
        module(tmp_path, label_names=["sports", "cooking"]).setup()


def test_a_hub_dataset_is_checked_by_the_same_rules(tmp_path, monkeypatch):
    import datasets

    rows = {"text": [f"text number {i}" for i in range(40)], "label": [i % 2 for i in range(40)]}
    hub = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)})
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: hub)
    dm = module(tmp_path, files=None, hub_name="someone/reviews")
    dm.setup()
    assert dm.label_names == ["0", "1"] and sum(len(s) for s in dm.splits.values()) == 40

    rows["label"][5] = None
    hub = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)})
    with pytest.raises(ValueError, match=r"someone/reviews train row 6.*incomplete_rows=skip"):
        module(tmp_path / "other", files=None, hub_name="someone/reviews").setup()


def test_train_fraction_subsets_train_only_and_is_its_own_cache_entry(tmp_path):
    full = module(tmp_path)
    full.setup()
    part = module(tmp_path, train_fraction=0.5)
    part.setup()
    assert len(part.splits["train"]) == len(full.splits["train"]) // 2
    for split in ("val", "test"):  # judged on the same rows as a full run
        assert part.splits[split]["labels"] == full.splits[split]["labels"]
        texts = [part.tokenizer.decode(ids) for ids in part.splits[split]["input_ids"]]
        assert texts == [full.tokenizer.decode(ids) for ids in full.splits[split]["input_ids"]]
    assert part.entry != full.entry
    with pytest.raises(ValueError, match="data.train_fraction"):
        module(tmp_path, train_fraction=0)


def test_longest_example_is_the_widest_training_batch_and_counts_padding_multiples(tmp_path):
    """What the memory preflight sizes activations by (laptrain.data.contracts.KnowsLengths)."""
    from laptrain.data.contracts import KnowsLengths

    dm = module(tmp_path)
    dm.setup()
    assert isinstance(dm, KnowsLengths)
    widest = max(b["input_ids"].shape[1] for b in dm.train_dataloader())
    assert dm.longest_example("train") == widest <= 32
    padded = module(tmp_path, pad_to_multiple_of=24)
    padded.setup()
    assert padded.longest_example("train") == -(-widest // 24) * 24


def test_a_tokenizer_retrained_into_the_same_folder_is_a_new_cache_entry(tmp_path):
    """The key holds the tokenizer folder's contents, not its name: stale ids are never reused."""
    from transformers import AutoTokenizer

    from laptrain.families.classifier.tokenizer import train_wordpiece

    folder = tmp_path / "tok"
    train_wordpiece(["alpha beta gamma delta"] * 10, 40).save_pretrained(folder)
    first = module(tmp_path, tokenizer=str(folder))
    first.setup()
    texts = (tmp_path / "t.csv").read_text().splitlines()
    train_wordpiece(texts, 200).save_pretrained(folder)  # retrained, same folder
    again = module(tmp_path, tokenizer=str(folder))
    again.setup()
    assert again.entry != first.entry
    assert again.tokenizer.get_vocab() == AutoTokenizer.from_pretrained(folder).get_vocab()
    assert again.tokenizer.get_vocab() != first.tokenizer.get_vocab()


def test_a_cache_entry_is_sealed_with_checksums_and_a_damaged_one_is_rebuilt(tmp_path):
    dm = module(tmp_path)
    dm.setup()
    expected = [dm.tokenizer.decode(ids) for ids in dm.splits["train"]["input_ids"]]
    arrow = next((dm.entry / "train").glob("*.arrow"))
    good = arrow.read_bytes()
    del dm
    for damaged in (good[: len(good) // 2], good[:-9] + bytes(9)):  # cut short; same size, changed
        arrow.unlink()  # a new file: the old one may still be memory-mapped
        arrow.write_bytes(damaged)
        again = module(tmp_path)
        again.setup()
        assert [
            again.tokenizer.decode(ids) for ids in again.splits["train"]["input_ids"]
        ] == expected
        assert text_classification.entry_ready(again.entry)
        del again
    files = json.loads((arrow.parents[1] / "meta.json").read_text())["files"]
    assert files[f"train/{arrow.name}"][0] == arrow.stat().st_size
    assert "tokenizer/tokenizer.json" in files


def test_a_writer_that_loses_the_race_keeps_the_winners_entry_without_error(tmp_path, monkeypatch):
    """Two runs build the same entry at once: the second rename finds the first's entry."""
    rename = os.rename
    raced = []

    def rename_after_a_rival(src, dst, *args, **kwargs):
        if not raced and Path(dst).parent.name == "tokenized":
            raced.append(src)
            module(tmp_path).prepare_data()  # the rival finishes first
        return rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", rename_after_a_rival)
    loser = module(tmp_path)
    loser.setup()
    assert raced and len(loser.splits["train"]) == 192
    assert [p.name for p in (tmp_path / "c" / "tokenized").iterdir()] == [loser.entry.name]


def test_tmp_folders_of_killed_runs_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    parent = tmp_path / "c" / "tokenized"
    here = socket.gethostname()
    killed = [f"0123abcd.tmp{dead.pid}", f"0123abcd.tmp{dead.pid}-a1b2c3@{here}"]
    kept = [f"0123abcd.tmp{os.getppid()}", f"0123abcd.tmp{dead.pid}-a1b2c3@another-host"]
    for name in killed + kept:
        (parent / name / "train").mkdir(parents=True)
    module(tmp_path).prepare_data()
    assert sorted(p.name for p in parent.iterdir() if ".tmp" in p.name) == sorted(kept)


def test_a_build_that_fails_leaves_nothing_half_written(tmp_path, monkeypatch):
    import datasets

    save = datasets.Dataset.save_to_disk
    calls = []

    def disk_full_on_the_second_split(self, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return save(self, path, *args, **kwargs)

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", disk_full_on_the_second_split)
    with pytest.raises(OSError, match="No space left"):
        module(tmp_path).prepare_data()
    assert list((tmp_path / "c" / "tokenized").iterdir()) == []


def test_each_fold_validates_on_its_own_rows_test_held_out_and_cached_apart(tmp_path):
    """k-fold (data.folds=3): the same 24 test rows in every fold, the other 216 in three folds of
    72, each fold's validation rows the others' training rows, and a cache entry per fold."""
    entries, vals, tests = set(), [], []
    for fold in range(3):
        dm = module(tmp_path, folds=3, fold=fold)
        dm.setup()
        assert {k: len(v) for k, v in dm.splits.items()} == {"train": 144, "val": 72, "test": 24}
        entries.add(dm.entry)
        texts = dm.read_splits(dm._resolve_files()).texts
        vals.append(set(texts["val"]))
        tests.append(set(texts["test"]))
        assert not set(texts["train"]) & (vals[-1] | tests[-1])
    assert len(entries) == 3 and tests[0] == tests[1] == tests[2]
    assert not (vals[0] & vals[1] or vals[0] & vals[2] or vals[1] & vals[2])


def test_folds_beside_a_validation_file_are_refused_in_one_line(tmp_path):
    files = {
        "train": str(write_texts(tmp_path / "a.csv")),
        "validation": str(write_texts(tmp_path / "b.csv", rows=30, seed=2)),
    }
    with pytest.raises(ValueError, match="set data.files.validation=null or data.folds=null"):
        module(tmp_path, files=files, folds=3).setup()
