"""Bad data files (tests/data/bad/) are each refused in one line naming the file, the line, what is
wrong and the fix; train.py refuses them before Hydra makes a run folder and before torch loads."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from laptrain.data.file_formats import MAX_TEXT_CHARS, DataError
from laptrain.data.precheck import check_data_config
from laptrain.families.classifier.labelled_files import Row, read_labelled, split_rows
from tests.conftest import CONF, compose_train, run_train
from tests.in_process import train_here

BAD = Path(__file__).resolve().parent / "data" / "bad"
GOOD = BAD / "train_ok.csv"

# file -> (data options, what the one line must say: the file (and line), what is wrong, the fix)
CASES: dict[str, tuple[dict, list[str]]] = {
    "empty.csv": ({}, ["empty.csv is empty", "header line"]),
    "header_only.csv": ({}, ["header_only.csv has a header (text, label) but no rows", "add"]),
    "latin1.csv": ({}, ["latin1.csv is not utf-8", "0xe9", "line 10", "data.encoding=latin-1"]),
    "utf16.csv": ({}, ["utf16.csv is not utf-8", "UTF-16", "data.encoding=utf-16"]),
    "empty_labels.csv": (
        {},
        ["empty_labels.csv: 4 rows with an empty or null 'label'", ":2, 3, 4", "incomplete_rows"],
    ),
    "null_labels.jsonl": (
        {},
        ["null_labels.jsonl: 2 rows", "null_labels.jsonl:4, 10", "data.incomplete_rows=skip"],
    ),
    "mixed_label_types.jsonl": (
        {},
        ["mix integers (11 rows", "text (1 row, e.g. ", "mixed_label_types.jsonl:7", "same way"],
    ),
    "few_rows_per_label.csv": (
        {},
        ["'weather' has only 1 row", "few_rows_per_label.csv:14", "data.files.validation="],
    ),
    "broken_line.jsonl": ({}, ["broken_line.jsonl:5: not valid JSON", "fix or delete the line"]),
    "json_array.jsonl": ({}, ["json_array.jsonl:1 is a JSON array of 12 items", ".json"]),
    "open_quote.csv": ({}, ["open_quote.csv:4: a quote opened", "never closed", "close it"]),
    "swallowed_rows.csv": (
        {},
        [
            "swallowed_rows.csv:4: a quote opened in this row runs on to line 6",
            "line 5",
            "close it",
        ],
    ),
    "stray_integer_label.csv": (
        {},
        [
            "stray_integer_label.csv:10: label 2000000 would make 2,000,001 classes",
            "4 distinct integer labels",
            "data.label_names=[0,1,2,2000000]",
        ],
    ),
    "deep.jsonl": (
        {},
        ["deep.jsonl:5: nested deeper than Python's JSON parser allows", "fix or delete the line"],
    ),
    "unseen_label.csv": (
        {"files": {"train": str(GOOD), "validation": str(BAD / "unseen_label.csv")}},
        ["label 'weather' in", "unseen_label.csv:2", "never occurs in", "data.label_names="],
    ),
    "numbers_as_text.csv": (
        {"text_column": "id"},
        ["numbers_as_text.csv", "'id' holds only numbers", "data.text_column=", "id, text, label"],
    ),
    "text_not_string.jsonl": (
        {},
        ["text_not_string.jsonl:3", "holds list", "not text", "data.text_column="],
    ),
    "extra_fields.csv": ({}, ["extra_fields.csv:6 has 3 fields", "double quotes"]),
    "semicolon.csv": ({}, ["column 'text' not in", "semicolon.csv", "comma-separated"]),
    "one_label.csv": ({}, ["one_label.csv", "label 'sports'", "two or more", "data.label_column"]),
    "missing_column": (
        {"files": {"train": str(GOOD)}, "label_column": "stars"},
        ["column 'stars' not in", "train_ok.csv", "columns: text, label", "data.label_column="],
    ),
    "no_file.csv": ({}, ["data file not found", "no_file.csv", "data.files.train="]),
    "notes.txt": ({}, ["notes.txt: unsupported file type '.txt'", ".csv"]),
    "label_is_list.jsonl": ({}, ["label_is_list.jsonl:3: the label is a list", "one label"]),
    "line_not_object.jsonl": ({}, ["line_not_object.jsonl:5 is a string, not an object"]),
    "no_validation_rows": (
        {"files": {"train": str(GOOD)}, "val_fraction": 0.0},
        ["no rows for validation", "train_ok.csv has 12 usable rows", "data.val_fraction="],
    ),
    "label_not_in_label_names": (
        {"files": {"train": str(GOOD)}, "label_names": ["sports", "weather"]},
        ["label 'cooking' (", "train_ok.csv:3", "not in data.label_names (sports, weather)"],
    ),
    "unknown_incomplete_rows": (
        {"files": {"train": str(GOOD)}, "incomplete_rows": "drop"},
        ["data.incomplete_rows=drop: use error or skip"],
    ),
    "unknown_encoding": (
        {"files": {"train": str(GOOD)}, "encoding": "latin-9x"},
        ["data.encoding=latin-9x is not an encoding Python knows"],
    ),
}
TEXT_CSV = OmegaConf.load(CONF / "data" / "text_csv.yaml")


def refusal(name: str) -> str:
    options = dict(CASES[name][0])
    files = options.pop("files", {"train": str(BAD / name)})
    try:
        read_labelled(files, **options)
    except (DataError, FileNotFoundError) as err:
        return str(err)
    raise AssertionError(f"{name} was accepted")


def test_the_corpus_has_a_case_for_every_bad_file():
    files = {p.name for p in BAD.iterdir() if p.is_file()}  # instructions/: its own test
    assert files - set(CASES) == {"train_ok.csv"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_bad_file_is_one_line_naming_the_file_the_line_and_the_fix(name):
    message = refusal(name)
    assert "\n" not in message
    for needle in CASES[name][1]:
        assert needle in message, message
    for option in re.findall(r"data\.([a-z_.]+)=", message):  # every fix it names exists
        assert OmegaConf.select(TEXT_CSV, option, default="missing") != "missing", option


def test_an_enormous_text_is_refused_with_its_line(tmp_path):
    path = tmp_path / "huge.jsonl"
    rows = [json.dumps({"text": f"short text {i}", "label": "ab"[i % 2]}) for i in range(12)]
    rows[7] = json.dumps({"text": "word " * (MAX_TEXT_CHARS // 5 + 10), "label": "a"})
    path.write_text("\n".join(rows))
    with pytest.raises(DataError, match=r"huge\.jsonl:8: a text of 1,000,050 characters.*cut"):
        read_labelled({"train": str(path)})
    path = tmp_path / "huge.csv"  # in a CSV the field limit stops it, at the row's first line
    path.write_text("text,label\nok,a\nfine,b\n" + "x" * (MAX_TEXT_CHARS + 5) + ",a\n")
    with pytest.raises(DataError, match=r"huge\.csv:4: a text of over 1,000,000"):
        read_labelled({"train": str(path)})


def test_the_fixes_the_messages_name_work():
    data = read_labelled({"train": str(BAD / "latin1.csv")}, encoding="latin-1")
    assert "un café au lait et une crêpe" in [t for ts in data.texts.values() for t in ts]
    assert read_labelled({"train": str(BAD / "utf16.csv")}, encoding="utf-16").label_names == [
        "cooking",
        "sports",
    ]
    data = read_labelled({"train": str(BAD / "null_labels.jsonl")}, incomplete_rows="skip")
    assert sum(len(t) for t in data.texts.values()) == 10
    assert data.notes == [
        f"skipped {BAD / 'null_labels.jsonl'}: 2 rows with an empty or null 'label' "
        f"({BAD / 'null_labels.jsonl'}:4, 10), of 12 rows (data.incomplete_rows=skip)"
    ]
    files = {"train": str(GOOD), "validation": str(BAD / "unseen_label.csv")}
    names = ["cooking", "sports", "weather"]
    assert read_labelled(files, label_names=names).labels["val"] == [2, 0, 1]


def test_a_utf8_bom_and_integer_labels_read_as_before(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes(
        b"\xef\xbb\xbftext,label\n" + b"".join(b"t %d,%d\n" % (i, i % 3) for i in range(30))
    )
    data = read_labelled({"train": str(path)})
    assert data.label_names == ["0", "1", "2"] and sorted(set(data.labels["train"])) == [0, 1, 2]


def test_integer_labels_are_positions_near_the_labels_seen_and_codes_can_be_listed(tmp_path):
    """0..K-1 with a class no row has still gives K classes (ids stay the integers); a range far
    wider than the labels (stray_integer_label.csv: one 2000000) is refused, and listing the
    integers in data.label_names reads them as codes."""
    path = tmp_path / "gap.csv"
    path.write_text("text,label\n" + "".join(f"t {i},{(0, 1, 3)[i % 3]}\n" for i in range(30)))
    data = read_labelled({"train": str(path)})
    assert data.label_names == ["0", "1", "2", "3"] and set(data.labels["train"]) == {0, 1, 3}
    stray = {"train": str(BAD / "stray_integer_label.csv")}
    data = read_labelled(stray, label_names=[0, 1, 2, 2000000])  # as Hydra passes a list of ints
    assert data.label_names == ["0", "1", "2", "2000000"]
    assert set(data.labels["train"]) == {0, 1, 2, 3}


def test_a_quote_left_open_is_named_on_the_line_where_it_opened(tmp_path):
    rows = "".join(f"row {i} text,{'ab'[i % 2]}\n" for i in range(20))
    shapes = {  # what follows the open quote on line 22 -> what the line says
        '"never closed,a\nnext row,b\nsize 12",a\n': "runs on to line 24, taking in lines",
        '"never closed,a\nnext row,b\nsize 12,a"\n': "runs on to line 24, leaving the row 1 of",
        '"never closed,a\nnext row,b\n"q" z,a\n': "runs on to line 24 (broken CSV there",
        '"never closed,a\nnext row,b\n': "is never closed",
    }
    for i, (opened, says) in enumerate(shapes.items()):
        path = tmp_path / f"q{i}.csv"
        path.write_text("text,label\n" + rows + opened + (rows if "size" in opened else ""))
        with pytest.raises(DataError) as err:
            read_labelled({"train": str(path)})
        assert f"q{i}.csv:22: a quote opened in this row {says}" in str(err.value)
        assert "\n" not in str(err.value)
    # texts over several lines, with commas, code and labels in them, read as they are
    path = tmp_path / "ok.csv"
    texts = ['"Dear John,\nI hope you are well, truly.\nBye",a', '"call f(a,b)\nx = g(a,b)\nb,a",b']
    path.write_text("text,label\n" + rows + "\n".join(texts) + "\n" + rows)
    data = read_labelled({"train": str(path)})
    assert "call f(a,b)\nx = g(a,b)\nb,a" in [t for ts in data.texts.values() for t in ts]


def test_a_huge_line_is_refused_as_it_is_read_not_after_loading_the_file(tmp_path):
    """A 40 MB single-line CSV or JSONL is refused after reading the line cap of it (8 M
    characters), naming the line and the limit; the whole file is never held in memory."""
    import tracemalloc

    csv_file, jsonl_file = tmp_path / "one_line.csv", tmp_path / "one_line.jsonl"
    csv_file.write_text("text,label\n" + "x" * 40_000_000)
    jsonl_file.write_text('{"text": "' + "x" * 40_000_000 + '", "label": "a"}\n')
    for path, line in ((csv_file, 2), (jsonl_file, 1)):
        tracemalloc.start()
        try:
            with pytest.raises(DataError) as err:
                read_labelled({"train": str(path)})
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        message = str(err.value)
        assert f"{path.name}:{line}: line {line} is over 8,000,000 characters" in message
        assert "1,000,000" in message and "cut or split the text" in message
        assert peak < 30e6, f"{path.name}: {peak / 1e6:.0f} MB held to refuse it"


def test_train_py_data_check_reads_the_composed_config(tmp_path, monkeypatch):
    cfg = compose_train(["data=text_csv", f"data.files.train={BAD / 'latin1.csv'}"], tmp_path)
    with pytest.raises(DataError, match="data.encoding=latin-1"):
        check_data_config(cfg.data)
    assert not (tmp_path / "cache").exists()
    check_data_config(compose_train([]).data)  # the default builder: read when the run builds it
    check_data_config(compose_train(["data=text_csv", "data.val_fraction=abc"]).data)

    train = tmp_path / "train.csv"
    train.write_bytes(GOOD.read_bytes())
    good = ["data=text_csv", f"data.files.train={train}", "data.files.validation=null"]
    check_data_config(compose_train(good, tmp_path).data)
    assert len(list((tmp_path / "cache" / "checked").iterdir())) == 1

    def boom(*args, **kwargs):
        raise AssertionError("read again")

    monkeypatch.setattr("laptrain.families.classifier.labelled_files.read_labelled", boom)
    check_data_config(compose_train(good, tmp_path).data)  # stamped: not read again
    train.write_text(train.read_text() + "one more row,sports\n")
    with pytest.raises(AssertionError, match="read again"):  # changed: read again
        check_data_config(compose_train(good, tmp_path).data)


def in_a_process(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return run_train(args, cwd, timeout=60)  # refused in seconds: never trains


# One case in a fresh process, where the time shows the refusal comes before torch loads; the
# others in this process (tests/in_process.py), where torch is already loaded.
@pytest.mark.parametrize(
    ("name", "run"),
    [
        pytest.param("latin1.csv", in_a_process, id="latin1.csv"),
        pytest.param("broken_line.jsonl", train_here, id="broken_line.jsonl"),
        pytest.param("empty_labels.csv", train_here, id="empty_labels.csv"),
        pytest.param("stray_integer_label.csv", train_here, id="stray_integer_label.csv"),
    ],
)
def test_train_py_exits_2_with_one_line_and_no_run_folder(tmp_path, name, run):
    start = time.perf_counter()
    args = ["data=text_csv", f"data.files.train={BAD / name}", "run_name=bad"]
    done = run(args, tmp_path)
    seconds = time.perf_counter() - start
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and name in errors[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "cache").exists()
    assert seconds < 20  # refused before torch loads (~1 s idle; torch alone takes ~7 s here)


def test_train_py_refuses_a_fold_outside_the_folds_before_torch_and_the_run_folder(tmp_path):
    """The default data (built, not a file) too: checked before the run, in a fresh process."""
    start = time.perf_counter()
    done = in_a_process(["data.folds=5", "data.fold=5", "run_name=bad"], tmp_path)
    seconds = time.perf_counter() - start
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "data.fold=5 is not a fold of data.folds=5" in errors[0]
    assert "data.fold=0..4" in errors[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "outputs").exists() and seconds < 20


def test_groups_never_straddle_splits_and_a_big_group_cannot_fill_a_split():
    rows = [Row(f"f:{i}", f"w{i}", "ab"[i % 2], i // 10) for i in range(100)]
    data = split_rows({"train": ("f", rows)}, 0.1, 0.1, seed=0)
    group_of = {r.text: r.group for r in rows}
    groups = {s: {group_of[t] for t in texts} for s, texts in data.texts.items()}
    assert not (groups["train"] & groups["val"]) and not (groups["train"] & groups["test"])

    # label "a": one 60-row group and many small ones; "b": small groups only
    keys = [0] * 60 + [1 + i // 4 for i in range(140)]
    labels = ["a"] * 60 + ["a" if i < 60 else "b" for i in range(140)]
    rows = [Row(f"f:{i}", f"x{i}", label, g) for i, (label, g) in enumerate(zip(labels, keys))]
    data = split_rows({"train": ("f", rows)}, 0.1, 0.1, seed=42)
    group_of = {r.text: r.group for r in rows}
    for split in ("val", "test"):
        assert 0 not in {group_of[t] for t in data.texts[split]}
        shares = [data.labels[split].count(i) for i in (0, 1)]
        assert 8 <= shares[0] <= 16 and 6 <= shares[1] <= 12, (split, shares)
