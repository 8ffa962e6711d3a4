"""Labelled texts, the classifier's data kind: the records of CSV / TSV / JSONL / JSON / Parquet
files (read by :mod:`laptrain.data.tables`) checked row by row and split into train / val / test.

Gap it fills: ``datasets`` reads empty CSV labels as the label ``nan``, and mixed label types
surface later as a misleading label error. Here every problem is one :class:`DataError` line: the
file, the line or row at fault, what is wrong, and the option or edit that fixes it (docs/data.md
lists them).

The rules live only here. ``TextClassificationDataModule`` reads its files through
:func:`read_labelled`, and the launcher calls it through the family's ``file_rules`` hook
(:func:`laptrain.data.precheck.check_data_config`) on the composed config before Hydra makes the
run folder. Why check before the run rather than clean up after a failure: Hydra creates
``outputs/<run>/`` (with ``.hydra/`` and ``train.log``) before the run starts, and the same folder
holds an earlier run's checkpoints when resuming, so deleting it after an error would have to prove
that this run made it and that nothing else is inside; refusing before it exists cannot lose
anything. This module imports neither torch nor ``datasets``, so a bad file is refused in about a
second, before torch loads. Files that passed are stamped in the cache (by content digest and
reading options), so a rerun does not read them again; the first run reads them twice (47 MB, 400k
rows: 7.6 s each on a 2-core machine, 4 s of it the stratified split).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from laptrain.data.file_formats import (
    LINE_BREAK,
    MAX_TEXT_CHARS,
    DataError,
    line_breaks,
    too_long_text,
    unclosed_quote,
)
from laptrain.data.splits import assign_splits, check_folds
from laptrain.data.tables import (
    SPLIT_ALIASES,
    SPLIT_OPTIONS,
    Table,
    check_fractions,
    check_train_and_val,
    read_table,
    resolve_files,
)

INCOMPLETE_ROWS = ("error", "skip")
LABELLED_OPTIONS: dict[str, type | tuple[type, ...]] = {
    **SPLIT_OPTIONS,
    "text_column": str,
    "label_column": str,
    "group_column": (str, type(None)),
    "label_names": (list, type(None)),
    "incomplete_rows": str,
}
_INTEGER = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


@dataclass(frozen=True)
class Row:
    where: str
    text: str
    label: Any
    group: Any = None


@dataclass(frozen=True)
class LabelledSplits:
    """Texts and label ids of the train / val / test splits, the label names, and notes to log."""

    texts: dict[str, list[str]]
    labels: dict[str, list[int]]
    label_names: list[str]
    notes: list[str] = field(default_factory=list)


# ---- checking rows -----------------------------------------------------------------------------


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def _first(wheres: Sequence[str], n: int = 3) -> str:
    """``a.csv:4, 9, 12, ...``: the first places, the file named once."""
    head, sep, _ = wheres[0].rpartition(":") if ":" in wheres[0] else ("", "", "")
    shown = [wheres[0]]
    for where in wheres[1:n]:
        same = sep and where.startswith(head + sep)
        shown.append(where[len(head) + 1 :] if same else where)
    return ", ".join(shown) + (", ..." if len(wheres) > n else "")


def _missing(value: Any) -> bool:
    if value.__class__ is str:
        return not value.strip()
    return value is None or (isinstance(value, float) and math.isnan(value))


def _label_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int):
        return "integers"
    if isinstance(value, float):
        return "decimals"
    return "text" if isinstance(value, str) else "lists or objects"


def _columns_error(table: Table, column: str, key: str) -> DataError:
    hint = ""
    if len(table.columns) == 1 and re.search(r"[;\t|]", table.columns[0]):
        hint = " (the header looks separated by another character: save the file comma-separated, or tab-separated as .tsv)"
    return DataError(
        f"column {column!r} not in {table.source} (columns: {', '.join(table.columns)}): "
        f"set data.{key}=<one of them>{hint}"
    )


def _check_columns(
    table: Table, text_column: str, label_column: str, group_column: str | None
) -> None:
    for key, col in (("text_column", text_column), ("label_column", label_column)):
        if col not in table.columns:
            raise _columns_error(table, col, key)
    if group_column and group_column not in table.columns:
        raise DataError(
            f"group column {group_column!r} not in {table.source} (columns: "
            f"{', '.join(table.columns)}): set data.group_column=<one of them> or null"
        )


@dataclass(frozen=True)
class _Sorted:
    """A table's rows sorted: usable, without a label, without a text, with a non-text text."""

    rows: list[Row]
    no_label: list[str]
    no_text: list[str]
    not_text: list[tuple[str, Any]]


def _sort_rows(
    table: Table, text_column: str, label_column: str, group_column: str | None
) -> _Sorted:
    rows: list[Row] = []
    no_label: list[str] = []
    no_text: list[str] = []
    not_text: list[tuple[str, Any]] = []
    for where, record in table.rows:
        text, label = record.get(text_column), record.get(label_column)
        if _missing(label):
            no_label.append(where)
            continue
        if _missing(text):
            no_text.append(where)
            continue
        if not isinstance(text, str):
            not_text.append((where, text))
            continue
        if len(text) > MAX_TEXT_CHARS:
            raise too_long_text(where, len(text))
        if table.untyped:
            label = label.strip()
        rows.append(Row(where, text, label, record.get(group_column) if group_column else None))
    return _Sorted(rows, no_label, no_text, not_text)


def _check_texts(table: Table, text_column: str, found: _Sorted) -> None:
    columns = ", ".join(table.columns)
    if found.not_text:
        where, value = found.not_text[0]
        raise DataError(
            f"{where}: data.text_column={text_column!r} holds {type(value).__name__} "
            f"{str(value)[:40]!r}, not text ({_rows(len(found.not_text))}): set "
            f"data.text_column=<the column with the texts> (columns: {columns})"
        )
    rows = found.rows
    if table.untyped and rows and all(_NUMBER.fullmatch(r.text.strip()) for r in rows):
        raise DataError(
            f"{table.source}: data.text_column={text_column!r} holds only numbers, not text "
            f"(e.g. {rows[0].where}): set data.text_column=<the column with the texts> "
            f"(columns: {columns})"
        )


def _incomplete_note(
    table: Table, found: _Sorted, text_column: str, label_column: str, incomplete_rows: str
) -> str:
    """The note on rows left out under ``incomplete_rows=skip``, or the error that refuses them."""
    parts = [
        f"{_rows(len(wheres))} with an empty or null {col!r} ({_first(wheres)})"
        for col, wheres in ((label_column, found.no_label), (text_column, found.no_text))
        if wheres
    ]
    what = f"{table.source}: {' and '.join(parts)}, of {_rows(len(table.rows))}"
    if incomplete_rows != "skip":
        raise DataError(f"{what}: fill them in, or set data.incomplete_rows=skip to leave them out")
    if not found.rows:
        raise DataError(f"{what}: no row is left (check data.label_column, data.text_column)")
    return f"skipped {what} (data.incomplete_rows=skip)"


def _swallowed_rows(table: Table, label_column: str) -> DataError | None:
    """A CSV quote left open that closed by chance right before a delimiter, so that strict
    parsing took the rows after it into one text: a field with line breaks whose first line ends
    its own row, and one of whose next lines is a whole row with a label the file uses (split on
    the delimiter, the label exactly as the file writes it: prose rarely matches)."""
    columns, sep = table.columns, table.delimiter
    if label_column not in columns:
        return None
    at = columns.index(label_column)
    labels: set[str] | None = None
    for where, record in table.rows:
        fields = [record.get(c) or "" for c in columns]
        k = next((i for i, v in enumerate(fields) if "\n" in v or "\r" in v), None)
        if k is None:
            continue
        if labels is None:
            labels = {v.strip() for _, r in table.rows if (v := r.get(label_column) or "")}
        lines = LINE_BREAK.split(fields[k])
        head = lines[0].split(sep)
        if len(head) != len(columns) - k or (at >= k and head[at - k] not in labels):
            continue
        for i, line in enumerate(lines[1:], start=1):
            pieces = line.split(sep)
            if len(pieces) == len(columns) and pieces[at] in labels and all(pieces):
                start = int(where.rpartition(":")[2])
                end = start + sum(line_breaks(v) for v in fields)
                return unclosed_quote(
                    where,
                    f"runs on to line {end}, taking in lines that look like rows of their own "
                    f"(line {start + i}: {line[:40]!r})",
                )
    return None


def check_rows(
    table: Table,
    text_column: str,
    label_column: str,
    group_column: str | None = None,
    incomplete_rows: str = "error",
) -> tuple[list[Row], list[str]]:
    """The usable rows of ``table`` and the notes to log (rows skipped), or a :class:`DataError`."""
    _check_columns(table, text_column, label_column, group_column)
    swallowed = _swallowed_rows(table, label_column) if table.untyped else None
    if swallowed:
        raise swallowed
    found = _sort_rows(table, text_column, label_column, group_column)
    _check_texts(table, text_column, found)
    notes: list[str] = []
    if found.no_label or found.no_text:
        notes.append(_incomplete_note(table, found, text_column, label_column, incomplete_rows))
    rows = found.rows
    if table.untyped and rows and all(_INTEGER.fullmatch(r.label) for r in rows):
        rows = [Row(r.where, r.text, int(r.label), r.group) for r in rows]
    return rows, notes


def _mixed_kinds_error(rows: Sequence[Row], label_column: str) -> DataError | None:
    kinds: dict[str, list[str]] = {}
    kind_of: dict[tuple[type, Any], str] = {}  # per distinct label: a few, not one per row
    for r in rows:
        value = r.label
        if isinstance(value, list | dict):
            kind = "lists or objects"
        else:
            kind = kind_of.get((value.__class__, value), "")
            if not kind:
                integer = isinstance(value, str) and _INTEGER.fullmatch(value)
                kind = _label_kind(0 if integer else value)  # a CSV integer among text labels
                kind_of[(value.__class__, value)] = kind
        kinds.setdefault(kind, []).append(r.where)
    if "lists or objects" in kinds:
        where = kinds["lists or objects"]
        return DataError(
            f"{where[0]}: the label is a list or object ({_rows(len(where))}): each row needs one "
            f"label in data.label_column={label_column!r}"
        )
    if len(kinds) < 2:
        return None
    parts = " and ".join(f"{k} ({_rows(len(w))}, e.g. {w[0]})" for k, w in kinds.items())
    return DataError(
        f"labels in data.label_column={label_column!r} mix {parts}: write every label the same "
        "way (all names or all integers)"
    )


# ---- splits and label ids ----------------------------------------------------------------------


def _integer_labels(rows: Sequence[Row]) -> list[int] | None:
    values = [r.label for r in rows]
    if values and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        return values
    return None


def _check_label_range(train: Sequence[Row]) -> None:
    """Integer labels are class positions 0..n: refuse a range where more than half the classes
    would have no row (one stray 2000000 among 0..4 would build a 2,000,001-class head)."""
    values = _integer_labels(train)
    if values is None:
        return
    top, distinct = max(values), sorted(set(values))
    if top + 1 > 2 * len(distinct):
        where = next(r.where for r in train if r.label == top)
        shown = ",".join(map(str, distinct)) if len(distinct) <= 8 else "..."
        raise DataError(
            f"{where}: label {top} would make {top + 1:,} classes for {len(distinct)} distinct "
            "integer labels (integer labels are class positions 0..n, so every integer up to "
            "the largest is a class): correct that label, or, if the integers are codes rather "
            f"than positions, list them in data.label_names=[{shown}]"
        )


def _label_names(train: Sequence[Row]) -> list[str]:
    """Text labels sorted; integer labels 0..n name classes "0".."n" by position, a class no
    training row has included (``_check_label_range`` keeps that range near the labels seen)."""
    values = _integer_labels(train)
    if values is not None:
        return [str(i) for i in range(max(values) + 1)]
    return sorted({str(r.label) for r in train})


def _split_off(
    named: Mapping[str, tuple[str, list[Row]]],
    fractions: Mapping[str, float],
    seed: int,
    folds: int | None = None,
    fold: int = 0,
) -> tuple[dict[str, list[Row]], dict[str, str]]:
    """Rows and source per split: val / test split off train (stratified, seeded) where no file
    gives them; with ``folds``, val is fold ``fold`` of what test leaves."""
    source, base = named["train" if "train" in named else "all"]
    sources = {"train": source}
    splits: dict[str, list[Row]] = {"train": base}
    missing = [s for s in ("val", "test") if s not in named]
    if missing:
        groups = [r.group for r in base] if any(r.group is not None for r in base) else None
        where = assign_splits(
            [str(r.label) for r in base],
            groups if groups is not None else range(len(base)),
            {s: fractions[s] for s in missing},
            seed,
            folds,
            fold,
        )
        for split in [*missing, "train"]:
            splits[split] = [r for r, w in zip(base, where, strict=True) if w == split]
            sources[split] = source
    for split in ("val", "test"):
        if split not in splits:
            sources[split], splits[split] = named[split]
    return splits, sources


def _unknown_label_error(
    value: str, wheres: list[str], in_source: str, source: str, base: Sequence[Row]
) -> DataError:
    """A label of ``in_source`` that training never sees (no ``data.label_names`` given)."""
    if in_source == source:  # split off train by us: too few rows of that label
        total = sum(1 for r in base if str(r.label) == value)
        return DataError(
            f"label {value!r} has only {_rows(total)} in {source} ({_first(wheres)}), too "
            "few to split validation and test off train and keep one to train on: add "
            "rows with that label, remove them, or give data.files.validation=<file> and "
            "data.files.test=<file>"
        )
    return DataError(
        f"label {value!r} in {in_source} ({_rows(len(wheres))}: {_first(wheres)}) never occurs "
        f"in {source}: add training rows with it, correct the label, or list every label in "
        "data.label_names=[...] to evaluate it anyway"
    )


def _label_ids(
    splits: Mapping[str, list[Row]], names: Sequence[str], fixed: bool
) -> tuple[dict[str, list[int]], tuple[str, str, list[str]] | None]:
    """Label ids per split (-1: unknown), and the first split with an unknown label: ``(split,
    label, places)``. Without ``fixed`` names a label training lacks is unknown too."""
    index = {str(name): i for i, name in enumerate(names)}
    in_train = {str(r.label) for r in splits["train"]}

    def label_id(value: Any) -> int | None:
        if str(value) in index:
            return index[str(value)]
        if fixed and isinstance(value, int) and not isinstance(value, bool):
            return value if 0 <= value < len(names) else None
        return None

    labels: dict[str, list[int]] = {}
    for split, rows in splits.items():
        ids, unknown = [], {}
        for r in rows:
            i = label_id(r.label)
            if i is None or (not fixed and str(r.label) not in in_train):
                unknown.setdefault(str(r.label), []).append(r.where)
            ids.append(-1 if i is None else i)
        if unknown:
            value, wheres = next(iter(unknown.items()))
            return labels, (split, value, wheres)
        labels[split] = ids
    return labels, None


def split_rows(
    named: Mapping[str, tuple[str, list[Row]]],
    val_fraction: float,
    test_fraction: float,
    seed: int,
    label_names: Sequence[str] | None = None,
    label_column: str = "label",
    folds: int | None = None,
    fold: int = 0,
) -> LabelledSplits:
    """Split off val / test where no file gives them (stratified, seeded; with ``folds``, val is
    fold ``fold``), then give every row its label id; refuses labels the model could not learn or
    that ``label_names`` lacks."""
    source, base = named["train" if "train" in named else "all"]
    fixed = [str(n) for n in label_names] if label_names else None
    if not fixed:
        _check_label_range(base)  # before the split: a stray label is named as itself
    check_folds(folds, fold, "val" in named)
    fractions = {"val": val_fraction, "test": test_fraction}
    splits, sources = _split_off(named, fractions, seed, folds, fold)
    mixed = _mixed_kinds_error([r for rows in splits.values() for r in rows], label_column)
    if mixed:
        raise mixed
    check_train_and_val(splits, source, f"{len(base)} usable rows", val_fraction)
    names = fixed or _label_names(splits["train"])
    if len({str(r.label) for r in splits["train"]}) < 2:
        raise DataError(
            f"{source}: every training row has the label {splits['train'][0].label!r}; a "
            f"classifier needs two or more (check data.label_column={label_column!r})"
        )
    labels, unknown = _label_ids(splits, names, bool(fixed))
    if unknown:
        split, value, wheres = unknown
        if fixed:
            raise DataError(
                f"label {value!r} ({_rows(len(wheres))}: {_first(wheres)}) is not in "
                f"data.label_names ({', '.join(names)}): add it there or correct those rows"
            )
        raise _unknown_label_error(value, wheres, sources[split], source, base)
    texts = {s: [r.text for r in rows] for s, rows in splits.items()}
    return LabelledSplits(texts, labels, names)


def read_labelled(
    files: Mapping[str, Any] | None,
    text_column: str = "text",
    label_column: str = "label",
    group_column: str | None = None,
    label_names: Sequence[str] | None = None,
    encoding: str = "utf-8",
    incomplete_rows: str = "error",
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    split_seed: int = 42,
    folds: int | None = None,
    fold: int = 0,
    tables: Mapping[str, Table] | None = None,
) -> LabelledSplits:
    """Read, check and split labelled texts: ``data.files`` (or ``tables`` already read, e.g. a
    hub dataset's splits) -> texts and label ids per split. Raises :class:`DataError` (one line)."""
    if incomplete_rows not in INCOMPLETE_ROWS:
        raise DataError(f"data.incomplete_rows={incomplete_rows}: use error or skip")
    check_fractions(val_fraction, test_fraction)
    if tables is None:
        tables = {s: read_table(p, encoding) for s, p in resolve_files(files).items()}
    named: dict[str, tuple[str, list[Row]]] = {}
    notes: list[str] = []
    for split, table in tables.items():
        rows, more = check_rows(table, text_column, label_column, group_column, incomplete_rows)
        named[SPLIT_ALIASES.get(split, split)] = (table.source, rows)
        notes += more
    if not {"train", "all"} & set(named):
        raise DataError("data.files needs a train file: set data.files.train=<file>")
    out = split_rows(
        named, val_fraction, test_fraction, split_seed, label_names, label_column, folds, fold
    )
    return LabelledSplits(out.texts, out.labels, out.label_names, notes)
