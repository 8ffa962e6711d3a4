"""One data file as a :class:`Table` of records, which files a ``data.files`` config names, and the
split checks every file-reading datamodule shares.

``datasets``' builders answer a broken line with "An error occurred while generating the dataset"
(datasets 5.2); here the standard library reads (pyarrow for Parquet), so every problem is one
:class:`DataError` line naming file, line and fix, and the pre-check runs before torch loads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laptrain.data.file_formats import (
    FORMATS,
    TOO_DEEP,
    DataError,
    csv_records,
    json_lines,
    parse_json,
    read_by_suffix,
    read_parquet,
    read_text,
)

SPLIT_ALIASES = {"train": "train", "validation": "val", "val": "val", "dev": "val", "test": "test"}
# The datamodule arguments a file check reads, with their types (laptrain.data.precheck): a value of
# another type is left to the config check, which names the argument.
SPLIT_OPTIONS: dict[str, type | tuple[type, ...]] = {
    "encoding": str,
    "val_fraction": (int, float),
    "test_fraction": (int, float),
    "split_seed": int,
    "folds": (int, type(None)),
    "fold": int,
}


@dataclass(frozen=True)
class Table:
    """The records of one file (or hub split): ``(where, record)``, ``where`` as ``file:line``;
    ``untyped``: every cell is a string (CSV), so numbers are recognised by their spelling."""

    source: str
    columns: list[str]
    rows: list[tuple[str, Mapping[str, Any]]]
    untyped: bool = False
    delimiter: str = ","


# ---- which files -------------------------------------------------------------------------------


def resolve_files(files: Mapping[str, Any] | None) -> dict[str, Path]:
    """``data.files`` as paths; a split set to null is left out (split off train instead)."""
    given = {k: v for k, v in (files or {}).items() if v is not None and str(v) != ""}
    if not given:
        raise DataError(
            "no data given: set data.files.train=<file> (csv/jsonl/parquet) or data.hub_name"
        )
    out: dict[str, Path] = {}
    for split, name in given.items():
        if split not in SPLIT_ALIASES and split != "all":
            raise DataError(
                f"unknown split {split!r} in data.files: use train, validation, test or all"
            )
        path = Path(str(name)).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"data file not found: {path} (set data.files.{split}=<path to a .csv, .jsonl or .parquet file>)"
            )
        if path.suffix.lower() not in FORMATS:
            raise DataError(
                f"{path}: unsupported file type {path.suffix!r}; use one of {', '.join(FORMATS)}"
            )
        out[split] = path
    if not {"train", "all"} & set(out):
        raise DataError("data.files needs a train file: set data.files.train=<file>")
    return out


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
        raise DataError("data.val_fraction + data.test_fraction must be below 1")


# ---- reading: each kind of file as a Table (which suffix is which: data/file_formats.py) --


def _read_csv(path: Path, encoding: str, delimiter: str) -> Table:
    header: list[str] | None = None
    rows: list[tuple[str, Mapping[str, Any]]] = []
    for line, fields in csv_records(path, encoding, delimiter):
        where = f"{path}:{line}"
        if header is None:
            header = [f.strip() for f in fields]
            continue
        if len(fields) > len(header):
            sep = "tab" if delimiter == "\t" else f"'{delimiter}'"
            raise DataError(
                f"{where} has {len(fields)} fields but the header has {len(header)} "
                f"(a {sep} inside an unquoted text?): put that text in double quotes"
            )
        rows.append((where, dict(zip(header, fields, strict=False))))
    if header is None:
        raise DataError(f"{path} is empty: give it a header line and one row per text")
    if not rows:
        raise DataError(
            f"{path} has a header ({', '.join(header)}) but no rows: add one row per text"
        )
    return Table(str(path), header, rows, untyped=True, delimiter=delimiter)


def _json_kind(value: Any) -> str:
    return {list: "an array", dict: "an object", str: "a string"}.get(type(value), "a value")


def _read_json(path: Path, encoding: str, document: bool) -> Table:
    records: list[tuple[str, Any]] = []
    whole: Any = None
    text: str | None = None
    if document:
        text = read_text(path, encoding)  # one document: read whole
        whole, why = parse_json(text)
        if why == TOO_DEEP:
            raise DataError(f"{path}: {TOO_DEEP}: flatten the data (one object per row)")
        if isinstance(whole, dict):
            raise DataError(
                f"{path} holds one JSON object, not rows: write an array of objects "
                '([{"text": ..., "label": ...}, ...]) or one object per line'
            )
        if isinstance(whole, list):
            records = [(f"{path} item {i + 1}", r) for i, r in enumerate(whole)]
        else:
            whole = None  # not one document: read it as JSON Lines
    if whole is None:
        broken: list[str] = []
        for number, value, why in json_lines(path, encoding, text):
            if why is not None:
                broken.append(f"{path}:{number}: {why}")
                continue
            if isinstance(value, list) and not records and len(value) > 1:
                raise DataError(
                    f"{path}:{number} is a JSON array of {len(value)} items on one line, not one "
                    "object per line: name the file .json, or write one object per line (JSONL)"
                )
            records.append((f"{path}:{number}", value))
        if broken:
            more = f" ({len(broken)} broken lines in all)" if len(broken) > 1 else ""
            raise DataError(
                f"{broken[0]}{more}: fix or delete the line (JSONL is one complete object per line)"
            )
    if not records:
        raise DataError(f"{path} is empty: write one JSON object per line")
    columns: dict[str, None] = {}
    for where, value in records:
        if not isinstance(value, dict):
            raise DataError(
                f"{where} is {_json_kind(value)}, not an object: write each row as "
                '{"text": ..., "label": ...}'
            )
        columns.update(dict.fromkeys(value))
    return Table(str(path), list(columns), records)


def _read_parquet(path: Path) -> Table:
    rows = [(f"{path} row {i + 1}", r) for i, r in enumerate(read_parquet(path))]
    return Table(str(path), list(rows[0][1]) if rows else [], rows)


def read_table(path: Path, encoding: str = "utf-8") -> Table:
    """The records of one data file, or a :class:`DataError` naming the line at fault."""
    return read_by_suffix(
        path, encoding, on_delimited=_read_csv, on_json=_read_json, on_parquet=_read_parquet
    )


def check_train_and_val(
    splits: Mapping[str, Sequence[Any]], source: str, held: str, val_fraction: float
) -> None:
    """Refuse splits without a training or validation row (``held``: what ``source`` holds)."""
    if not splits["train"]:
        raise DataError(f"{source} has no row left for training: add rows")
    if not splits["val"]:
        raise DataError(
            f"no rows for validation: {source} has {held} and "
            f"data.val_fraction={val_fraction}: add rows, raise data.val_fraction, or give "
            "data.files.validation=<file>"
        )
