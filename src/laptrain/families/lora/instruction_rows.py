"""Instruction rows: read, checked and split without torch, so ``train.py`` refuses bad rows
before the run folder exists (``laptrain.data.precheck.check_data_config``) by the same rules
``InstructionDataModule`` applies when it builds its cache.

Rows are ``{prompt, response}``, ``{prompt, completion}`` or ``{messages: [{role, content}, ...]}``,
with TRL's conversational prompt-completion too (``prompt`` and ``completion`` as message lists),
or TRL's language-modeling ``{text}`` (:class:`PlainText`: no chat template, every token trained);
one data set holds text rows or chat rows, never both. A bad row is named by ``file:line`` with the reason (a field that is neither a string nor a list
of ``{role, content}`` messages is named). Checks that need the tokenizer (a response
that does not fit ``data.max_length``) stay in the datamodule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laptrain.data.file_formats import (
    MAX_TEXT_CHARS,
    TOO_DEEP,
    DataError,
    csv_records,
    json_lines,
    parse_json,
    read_by_suffix,
    read_parquet,
    read_text,
)
from laptrain.data.splits import assign_splits, check_folds
from laptrain.data.tables import (
    SPLIT_ALIASES,
    SPLIT_OPTIONS,
    check_fractions,
    check_train_and_val,
    resolve_files,
)

ROLES = ("system", "user", "assistant")
# The arguments the file check before the run reads (laptrain.data.precheck), with their types.
INSTRUCTION_OPTIONS: dict[str, type | tuple[type, ...]] = {
    **SPLIT_OPTIONS,
    "group_column": (str, type(None)),
    "system_prompt": (str, type(None)),
}
Messages = list[dict[str, str]]


@dataclass(frozen=True)
class PlainText:
    """TRL's language-modeling row ``{"text": ...}``: tokenized without the chat template and
    trained on whole, as TRL's SFTTrainer trains a "text" dataset."""

    text: str


Rows = dict[str, list[tuple[str, Messages | PlainText, Any]]]  # split -> (file:line, row, group)


def to_messages(row_or_prompt: str | Messages, system_prompt: str | None = None) -> Messages:
    """A prompt string or a messages list as messages, contents stripped (templates trim them),
    with ``system_prompt`` first unless the messages already start with a system turn."""
    if isinstance(row_or_prompt, str):
        messages = [{"role": "user", "content": row_or_prompt}]
    else:
        messages = [{"role": m["role"], "content": m["content"]} for m in row_or_prompt]
    messages = [{"role": m["role"], "content": str(m["content"]).strip()} for m in messages]
    if system_prompt and (not messages or messages[0]["role"] != "system"):
        messages.insert(0, {"role": "system", "content": system_prompt.strip()})
    return messages


# ---- reading rows ------------------------------------------------------------------------------


def read_rows(path: Path, encoding: str = "utf-8") -> list[tuple[str, Any]]:
    """``(file:line, row)`` for each row; a row that cannot be parsed is the reason, as a string.

    JSONL and CSV are read here rather than through ``datasets`` so that bad rows are named by
    their line in the file (a CSV row's first line); JSON arrays and Parquet rows by position.
    The suffix picks the reader (:func:`laptrain.data.file_formats.read_by_suffix`, which labelled
    texts use too): streamed, strict CSV quoting, texts of at most ``MAX_TEXT_CHARS``, lines of at most ``MAX_LINE_CHARS``; an empty
    file, a header without rows, another encoding, an over-long text and a quote left open are
    refused in one line.
    """
    return read_by_suffix(
        path,
        encoding,
        on_delimited=_read_csv_rows,
        on_json=_read_json_rows,
        on_parquet=_read_parquet_rows,
    )


def _read_parquet_rows(path: Path) -> list[tuple[str, Any]]:
    return [(f"{path}:{i + 1}", r) for i, r in enumerate(read_parquet(path))]


def _read_json_rows(path: Path, encoding: str, document: bool) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    text = None
    if document:
        text = read_text(path, encoding)
        if text.lstrip().startswith("["):
            rows, why = parse_json(text)
            if why is not None:
                raise DataError(f"{path}: {why}: fix it, or write one JSON object per line")
            return [(f"{path}:{i + 1}", r) for i, r in enumerate(rows)]
    for number, value, why in json_lines(path, encoding, text):
        bad = "not JSON" if why is not None and why != TOO_DEEP else why
        out.append((f"{path}:{number}", value if bad is None else bad))
    if not out:
        raise DataError(f"{path} is empty: write one JSON object per line")
    return out


def _read_csv_rows(path: Path, encoding: str, delimiter: str) -> list[tuple[str, Any]]:
    header: list[str] | None = None
    out: list[tuple[str, Any]] = []
    for line, fields in csv_records(path, encoding, delimiter):
        if header is None:
            header = [f.strip() for f in fields]
            continue
        where = f"{path}:{line}"
        if len(fields) > len(header):
            sep = "a tab" if delimiter == "\t" else f"a '{delimiter}'"
            why = f"{len(fields)} fields, header {len(header)}: quote the text with {sep} in it"
            out.append((where, why))
            continue
        out.append((where, dict(zip(header, fields, strict=False))))
    if header is None:
        raise DataError(f"{path} is empty: give it a header line and one row per example")
    if not out:
        raise DataError(
            f"{path} has a header ({', '.join(header)}) but no rows: add one row per example"
        )
    return out


def field_value(row: Mapping[str, Any], key: str) -> tuple[str | Messages | None, str | None]:
    """``(value, why)`` of ``row[key]``: a string, a list of ``{role, content}`` messages (TRL's
    conversational form, also as a JSON list in a CSV cell), None when absent, or why it is
    neither (any other value is never turned into text)."""
    value = row.get(key)
    if value is None:
        return None, None
    if isinstance(value, str):
        if not value.lstrip().startswith("[{"):
            return value, None
        parsed, why = parse_json(value)
        if why is not None or not _message_list(parsed):
            return value, None  # text that only looks like a list
        value = parsed
    if not _message_list(value):
        return None, f"{key} is {type(value).__name__}, not a string or a list of {{role, content}}"
    for m in value:
        if m.get("role") not in ROLES:
            return None, f"{key}: unknown role {m.get('role')!r}"
        if not isinstance(m.get("content"), str):
            return None, f"{key}: a message's content is not a string"
    return [{"role": m["role"], "content": m["content"]} for m in value], None


def _message_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(m, Mapping) and "role" in m for m in value)


def row_messages(row: Any, system_prompt: str | None = None) -> Messages | PlainText | str:
    """The row as messages (a text row as :class:`PlainText`), or why it is a bad row (a short
    string)."""
    if not isinstance(row, Mapping):
        return row if isinstance(row, str) else "not an object"
    system = row.get("system") or system_prompt
    messages = row.get("messages")
    if messages is not None and messages != "":
        if isinstance(messages, str):
            messages, why = parse_json(messages)
            if why is not None:
                return "messages not JSON" if why != TOO_DEEP else f"messages {why}"
        if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
            return "messages not a list of {role, content}"
        for m in messages:
            if m.get("role") not in ROLES:
                return f"unknown role {m.get('role')!r}"
            if m.get("content") is None:
                return "message without content"
            if not isinstance(m["content"], str):
                return "messages: a message's content is not a string"
        return _with_response(to_messages(messages, system))
    key = "response" if row.get("response") is not None else "completion"
    prompt, why = field_value(row, "prompt")
    response, why_response = field_value(row, key)
    if why or why_response:
        return why or str(why_response)
    if prompt is None and response is None and "text" in row:
        return _plain_text(row["text"])
    if prompt is None:
        return "no prompt"
    if response is None:
        return "no response"
    if isinstance(response, str):
        response = [{"role": "assistant", "content": response}]
    elif any(m["role"] != "assistant" for m in response):
        return f"{key} holds a turn other than the assistant's"
    return _with_response(to_messages(prompt, system) + to_messages(response))


def _plain_text(text: Any) -> PlainText | str:
    if not isinstance(text, str):
        return f"text is {type(text).__name__}, not a string"
    if not text.strip():
        return "empty text"
    return _too_long([{"content": text}]) or PlainText(text)


def _with_response(messages: Messages) -> Messages | str:
    assistant = [m for m in messages if m["role"] == "assistant"]
    if not assistant:
        return "no assistant turn"
    if not assistant[-1]["content"]:
        return "empty response"
    return _too_long(messages) or messages


def _too_long(messages: Messages) -> str | None:
    longest = max(len(m["content"]) for m in messages)
    if longest > MAX_TEXT_CHARS:
        return f"a text of {longest:,} characters, over the {MAX_TEXT_CHARS:,} laptrain reads"
    return None


def rows_error(need: str, bad: list[tuple[str, str]], total: int) -> DataError:
    """One line: what the rows ``need``, the first three bad rows as ``file:line (why)``, the
    count, and the fix."""
    named = ", ".join(f"{where} ({why})" for where, why in bad[:3])
    more = ", ..." if len(bad) > 3 else ""
    return DataError(f"{need}: {named}{more} ({len(bad)} bad rows of {total}): fix or drop them")


def bad_rows_error(bad: list[tuple[str, str]], total: int) -> DataError:
    """:func:`rows_error` for instruction rows."""
    return rows_error(
        "data rows need prompt+response (or completion) or messages with system/user/assistant "
        "roles and a response that fits data.max_length",
        bad,
        total,
    )


def read_named_rows(
    files: Mapping[str, Any] | None,
    parse: Callable[[Any], Any],
    refuse: Callable[[list[tuple[str, str]], int], Exception],
    group_column: str | None = None,
    encoding: str = "utf-8",
) -> dict[str, list[tuple[str, Any, Any]]]:
    """``split -> [(file:line, parse(row), group)]`` for every file; ``parse`` returns a string
    (why) for a bad row, and all bad rows are refused at once: ``refuse(bad, total)``."""
    bad: list[tuple[str, str]] = []
    total = 0
    named: dict[str, list[tuple[str, Any, Any]]] = {}
    for split, path in resolve_files(files).items():
        rows = []
        for where, raw in read_rows(path, encoding):
            total += 1
            found = parse(raw)
            if isinstance(found, str):
                bad.append((where, found))
                continue
            group = raw.get(group_column) if group_column else None
            rows.append((where, found, group))
        named[SPLIT_ALIASES.get(split, split)] = rows
    if bad:
        raise refuse(bad, total)
    return named


def read_instructions(
    files: Mapping[str, Any] | None,
    system_prompt: str | None = None,
    group_column: str | None = None,
    encoding: str = "utf-8",
) -> Rows:
    """Every file's rows as messages (or text rows), or one error naming the bad rows
    (``file:line (why)``), or one naming a row whose kind (text or chat) differs from the first."""
    named = read_named_rows(
        files, lambda raw: row_messages(raw, system_prompt), bad_rows_error, group_column, encoding
    )
    rows = [
        (where, isinstance(row, PlainText)) for split in named.values() for where, row, _ in split
    ]
    odd = next((where for where, text in rows if text != rows[0][1]), None)
    if odd is not None:
        kinds = {True: "a text row", False: "a prompt/completion or messages row"}
        raise DataError(
            f"{odd} is {kinds[not rows[0][1]]} but {rows[0][0]} is {kinds[rows[0][1]]}: write "
            "every row of the data in one form ({text} rows train on every token, chat rows on "
            "the responses only)"
        )
    return named


def split_instruction_rows(
    named: Rows,
    val_fraction: float,
    test_fraction: float,
    seed: int,
    folds: int | None = None,
    fold: int = 0,
) -> Rows:
    """Validation and test split off train where no file gives them (seeded; whole groups); with
    ``folds``, validation is fold ``fold`` of what test leaves."""
    check_fractions(val_fraction, test_fraction)
    check_folds(folds, fold, "val" in named)
    base = named.get("train", named.get("all"))
    if base is None:
        raise DataError("data.files needs a train file: set data.files.train=<file>")
    splits = {s: named[s] for s in ("val", "test") if s in named}
    missing = {s: f for s, f in (("val", val_fraction), ("test", test_fraction))}
    missing = {s: f for s, f in missing.items() if s not in splits}
    if missing:
        groups = [g if g is not None else ("row", i) for i, (_, _, g) in enumerate(base)]
        where = assign_splits([""] * len(base), groups, missing, seed, folds, fold)
        for split in [*missing, "train"]:
            splits[split] = [r for r, w in zip(base, where, strict=True) if w == split]
    else:
        splits["train"] = base
    source = base[0][0].rsplit(":", 1)[0] if base else "the train file"
    check_train_and_val(splits, source, f"{len(base)} rows", val_fraction)
    return splits


def check_instructions(
    files: Mapping[str, Any] | None,
    system_prompt: str | None = None,
    group_column: str | None = None,
    encoding: str = "utf-8",
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    split_seed: int = 42,
    folds: int | None = None,
    fold: int = 0,
    read: Callable[..., Rows] = read_instructions,
) -> Rows:
    """The rows read (``read``: instructions, or another kind of row) and split as the datamodule
    will (``train.py``'s data check)."""
    named = read(files, system_prompt, group_column, encoding)
    return split_instruction_rows(named, val_fraction, test_fraction, split_seed, folds, fold)
