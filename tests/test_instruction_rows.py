"""Bad instruction files (tests/data/bad/instructions/) are refused in one line naming the file,
the line and the fix, by train.py before the run folder exists and by the datamodule alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from laptrain.data.instruction_rows import check_instructions
from laptrain.data.labelled_files import DataError
from laptrain.data.precheck import check_data_config
from tests.conftest import compose_train, run_train

BAD = Path(__file__).resolve().parent / "data" / "bad" / "instructions"

CASES = {
    "empty.jsonl": ({}, ["empty.jsonl is empty"]),
    "latin1.jsonl": ({}, ["latin1.jsonl is not utf-8", "line 6", "data.encoding=latin-1"]),
    "bad_rows.jsonl": (
        {},
        ["bad_rows.jsonl:3 (not JSON)", "bad_rows.jsonl:7 (no response)", "2 bad rows of 12"],
    ),
    "header_only.csv": ({}, ["header_only.csv has a header (prompt, response) but no rows"]),
    "one_row.jsonl": ({}, ["one_row.jsonl has no row left for training", "add rows"]),
}


def test_the_corpus_has_a_case_for_every_bad_file():
    assert {p.name for p in BAD.iterdir()} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_bad_instruction_file_is_one_line_naming_the_file_and_the_fix(name):
    options, needles = CASES[name]
    with pytest.raises(DataError) as err:
        check_instructions({"train": str(BAD / name)}, **options)
    assert "\n" not in str(err.value)
    for needle in needles:
        assert needle in str(err.value), str(err.value)


def test_the_encoding_fix_works_and_the_config_carries_it(tmp_path):
    splits = check_instructions({"train": str(BAD / "latin1.jsonl")}, encoding="latin-1")
    prompts = [m[0]["content"] for rows in splits.values() for _, m, _ in rows]
    assert "Où est le café ?" in prompts
    args = ["data=instructions", f"data.files.train={BAD / 'latin1.jsonl'}"]
    with pytest.raises(DataError, match="data.encoding=latin-1"):
        check_data_config(compose_train(args, tmp_path).data)
    check_data_config(compose_train([*args, "data.encoding=latin-1"], tmp_path).data)


def test_train_py_refuses_bad_instruction_rows_before_the_run_folder(tmp_path):
    args = ["data=instructions", f"data.files.train={BAD / 'bad_rows.jsonl'}", "run_name=bad"]
    done = run_train(args, tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "bad_rows.jsonl:3 (not JSON)" in errors[0]
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "cache").exists()
