"""Bad instruction files (tests/data/bad/instructions/) are refused in one line naming the file,
the line and the fix, by train.py before the run folder exists and by the datamodule alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from laptrain.data.file_formats import MAX_TEXT_CHARS, DataError
from laptrain.data.precheck import check_data_config
from laptrain.families.lora.instruction_rows import check_instructions
from tests.conftest import compose_train
from tests.in_process import train_here

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
    "open_quote.csv": (
        {},
        ["open_quote.csv:5: a quote opened in this row is never closed", "close it"],
    ),
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
    done = train_here(args, tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "bad_rows.jsonl:3 (not JSON)" in errors[0]
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "cache").exists()


def qa_csv(path: Path, n: int = 12, last: str = "") -> Path:
    rows = "".join(f"What does function number {i} do?,It returns {i}.\n" for i in range(n))
    path.write_text("prompt,response\n" + rows + last)
    return path


def test_a_csv_field_is_read_up_to_the_text_limit_and_refused_above_it_by_line(tmp_path):
    """Python's csv stops at 131,072 characters per field (a csv.Error traceback); instruction
    CSVs are read like labelled texts: up to MAX_TEXT_CHARS, then one line with the row."""
    long = qa_csv(tmp_path / "long.csv", last=f'"{"word " * 40_000}",It is long.\n')
    prompts = [
        m[0]["content"]
        for rows in check_instructions({"train": str(long)}).values()
        for _, m, _ in rows
    ]
    assert max(map(len, prompts)) == len("word " * 40_000) - 1  # 200,000 characters, stripped
    huge = qa_csv(tmp_path / "huge.csv", last=f'"{"x" * (MAX_TEXT_CHARS + 1)}",It is huge.\n')
    with pytest.raises(DataError, match=r"huge\.csv:14: a text of over 1,000,000 characters.*cut"):
        check_instructions({"train": str(huge)})


def test_a_quote_left_open_or_unquoted_commas_are_refused_not_merged(tmp_path):
    mid = qa_csv(tmp_path / "mid.csv", last='"open,ended\nWhat is "x" here?,It is x.\n')
    with pytest.raises(
        DataError, match=r"mid\.csv:14: a quote opened in this row runs on to line 15"
    ):
        check_instructions({"train": str(mid)})
    commas = qa_csv(tmp_path / "commas.csv", last="What is a, b?,A pair.\n")
    with pytest.raises(DataError, match=r"commas\.csv:14 \(3 fields, header 2: quote the text"):
        check_instructions({"train": str(commas)})


def test_json_nested_deeper_than_the_parser_allows_is_a_bad_row_not_a_traceback(tmp_path):
    rows = [json.dumps({"prompt": f"q {i}", "response": f"r {i}"}) for i in range(12)]
    rows[6] = '{"prompt": "deep", "response": ' + "[" * 50_000 + "]" * 50_000 + "}"
    path = tmp_path / "deep.jsonl"
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(DataError) as err:
        check_instructions({"train": str(path)})
    assert "deep.jsonl:7 (nested deeper than Python's JSON parser allows)" in str(err.value)
    messages = [{"role": "user", "content": "q"}] * 3
    csv_file = tmp_path / "deep.csv"  # a messages column holding JSON, as CSV rows carry it
    csv_file.write_text(
        "messages\n"
        + "".join(
            '"'
            + json.dumps([*messages, {"role": "assistant", "content": f"a {i}"}]).replace('"', '""')
            + '"\n'
            for i in range(11)
        )
        + '"'
        + "[" * 50_000
        + "]" * 50_000
        + '"\n'
    )
    with pytest.raises(DataError, match=r"deep\.csv:13 \(messages nested deeper"):
        check_instructions({"train": str(csv_file)})


def test_train_py_refuses_an_over_long_csv_field_in_one_line(tmp_path):
    huge = qa_csv(tmp_path / "huge.csv", last=f'"{"x" * (MAX_TEXT_CHARS + 1)}",It is huge.\n')
    done = train_here(["data=instructions", f"data.files.train={huge}", "run_name=bad"], tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "huge.csv:14: a text of over 1,000,000 characters" in errors[0]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "cache").exists()


def test_instruction_rows_under_folds_validate_on_each_fold_with_test_held_out(tmp_path):
    path = qa_csv(tmp_path / "qa.csv", n=30)
    splits = [check_instructions({"train": str(path)}, folds=3, fold=f) for f in range(3)]
    where = [{s: {w for w, _, _ in rows} for s, rows in split.items()} for split in splits]
    assert all(w["test"] == where[0]["test"] and len(w["test"]) == 3 for w in where)
    assert [len(w["val"]) for w in where] == [9, 9, 9]
    assert set().union(*(w["val"] for w in where)) == where[0]["train"] | where[0]["val"]
    with pytest.raises(DataError, match="data.fold=3 is not a fold of data.folds=3"):
        check_instructions({"train": str(path)}, folds=3, fold=3)


def test_train_py_refuses_a_fold_outside_the_folds_before_the_run_folder(tmp_path):
    path = qa_csv(tmp_path / "qa.csv", n=30)
    args = ["data=instructions", f"data.files.train={path}", "data.folds=3", "data.fold=3"]
    done = train_here([*args, "run_name=bad"], tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "data.fold=3 is not a fold of data.folds=3" in errors[0]
    assert not (tmp_path / "outputs").exists()


def test_preference_rows_under_folds_keep_each_group_in_one_fold(tmp_path):
    from laptrain.families.lora.preference_rows import check_preferences

    path = tmp_path / "pairs.jsonl"
    rows = [
        {"prompt": f"Q{i}?", "chosen": f"A{i}.", "rejected": "No.", "source": f"s{i // 3}"}
        for i in range(60)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = {f"{path}:{i + 1}": r["source"] for i, r in enumerate(rows)}
    options = {"group_column": "source", "folds": 4}
    splits = [check_preferences({"train": str(path)}, **options, fold=f) for f in range(4)]
    tests = [{w for w, _, _ in split["test"]} for split in splits]
    assert tests[0] and all(t == tests[0] for t in tests)
    vals = [{source[w] for w, _, _ in split["val"]} for split in splits]
    trains = [{source[w] for w, _, _ in split["train"]} for split in splits]
    assert all(not (v & t) for v, t in zip(vals, trains)) and not (vals[0] & vals[1])
    assert set().union(*vals) == {source[w] for w in source} - {source[w] for w in tests[0]}


# ----- issue 48 item 8: every dataset format TRL documents for SFT --------------------------------
QUESTION = [{"role": "user", "content": "What does `len` do?"}]
REPLY = [{"role": "assistant", "content": "Counts items."}]


@pytest.mark.parametrize(
    "row",
    [
        {"prompt": "What does `len` do?", "completion": "Counts items."},
        {"prompt": "What does `len` do?", "response": "Counts items."},
        {"messages": QUESTION + REPLY},
        {"prompt": QUESTION, "completion": REPLY},  # TRL's conversational prompt-completion
        {"prompt": json.dumps(QUESTION), "completion": json.dumps(REPLY)},  # as CSV cells
    ],
)
def test_every_sft_row_shape_reads_as_the_same_conversation(row):
    from laptrain.families.lora.instruction_rows import row_messages

    assert row_messages(row) == QUESTION + REPLY


@pytest.mark.parametrize(
    "row, why",
    [
        ({"prompt": {"text": "q"}, "completion": "a"}, "prompt is dict, not a string"),
        ({"prompt": "q", "completion": 3}, "completion is int, not a string"),
        ({"prompt": "q", "completion": QUESTION}, "other than the assistant's"),
        ({"prompt": [{"role": "user", "content": ["q"]}], "completion": REPLY}, "not a string"),
        ({"text": ["The sky is blue."]}, "text is list, not a string"),
    ],
)
def test_any_other_value_is_refused_naming_the_field(row, why):
    from laptrain.families.lora.instruction_rows import row_messages

    assert why in row_messages(row)


def test_a_list_prompt_is_never_trained_on_as_its_repr(tmp_path):
    from laptrain.families.lora.instruction_rows import read_instructions

    path = tmp_path / "rows.jsonl"
    rows = [{"prompt": QUESTION, "completion": REPLY}, {"prompt": ["q"], "completion": "a"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as err:
        read_instructions({"train": str(path)})
    message = str(err.value)
    assert f"{path}:2 (prompt is list, not a string" in message and "\n" not in message


def test_a_file_mixing_text_rows_and_chat_rows_is_refused_naming_the_line(tmp_path):
    """TRL's language-modeling rows train on every token, chat rows on their responses: one data
    set holds one kind, refused by train.py before the run folder exists."""
    path = tmp_path / "mixed.jsonl"
    rows = [{"text": f"Text number {i}."} for i in range(8)]
    rows.insert(2, {"prompt": "What does `len` do?", "completion": "Counts items."})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = train_here(["data=instructions", f"data.files.train={path}", "run_name=bad"], tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr[-2000:]
    assert (
        f"{path}:3 is a prompt/completion or messages row but {path}:1 is a text row" in errors[0]
    )
    assert "every row of the data in one form" in errors[0]
    assert not (tmp_path / "outputs").exists()
