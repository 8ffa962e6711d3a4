"""Data files by suffix: the one place that knows which suffixes laptrain reads and how each kind
is opened, streamed and parsed; every problem is one :class:`DataError` line naming the file, the
line and the fix (docs/data.md)."""

from __future__ import annotations

import codecs
import csv
import io
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

T = TypeVar("T")

# Longer texts are refused: the model reads only data.max_length tokens, and in a CSV such a field
# is nearly always a quote left open that swallowed the lines after it.
MAX_TEXT_CHARS = 1_000_000
# A physical line longer than this is refused as it is read (a CSV row of several long fields, or a
# JSON line whose escapes make a text up to 6x longer, fits; a 1 GB line is never loaded whole).
MAX_LINE_CHARS = 8 * MAX_TEXT_CHARS
TOO_DEEP = "nested deeper than Python's JSON parser allows"


class DataError(ValueError):
    """Bad data: one line naming the file, the row or line, what is wrong and the fix."""


@dataclass(frozen=True)
class FileFormat:
    """How one suffix is read: ``kind`` (``delimited`` text with a header line, ``json`` or
    ``parquet``), a delimited file's ``delimiter``, and whether a JSON file is one ``document`` (an
    array of rows; a ``.json`` file that is no array is read as JSON Lines)."""

    kind: str
    delimiter: str = ","
    document: bool = False


FORMATS: dict[str, FileFormat] = {
    ".csv": FileFormat("delimited", ","),
    ".tsv": FileFormat("delimited", "\t"),
    ".json": FileFormat("json", document=True),
    ".jsonl": FileFormat("json"),
    ".parquet": FileFormat("parquet"),
}
# Another suffix is read as JSON Lines: ``data.files`` refuses it first (``resolve_files``), and
# ``laptrain eval --data`` reads it so.
_OTHER = FileFormat("json")


def file_format(path: Path) -> FileFormat:
    return FORMATS.get(path.suffix.lower(), _OTHER)


def read_by_suffix(
    path: Path,
    encoding: str,
    *,
    on_delimited: Callable[[Path, str, str], T],
    on_json: Callable[[Path, str, bool], T],
    on_parquet: Callable[[Path], T],
) -> T:
    """``path`` read by the reader of its suffix's kind: ``on_delimited(path, encoding,
    delimiter)`` (over :func:`csv_records`), ``on_json(path, encoding, document)`` (over
    :func:`read_text` and :func:`json_lines`) or ``on_parquet(path)`` (over :func:`read_parquet`)."""
    found = file_format(path)
    if found.kind == "delimited":
        return on_delimited(path, encoding, found.delimiter)
    if found.kind == "parquet":
        return on_parquet(path)
    return on_json(path, encoding, found.document)


# Text files are streamed: a CSV through ``csv.reader`` over the open file, JSONL line by line, each
# physical line read with a cap (``MAX_LINE_CHARS``) and each CSV field capped by the csv module's
# field limit, so a 1 GB line is refused after reading 8 M characters of it, not after loading,
# decoding and copying the whole file. A ``.json`` array is one document and is read whole.


def _codec(encoding: str) -> str:
    """The codec to open text files with (``utf-8-sig`` for UTF-8: Excel's byte-order mark is
    dropped), or a :class:`DataError` for an encoding Python does not know."""
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        raise DataError(
            f"data.encoding={encoding} is not an encoding Python knows: use utf-8, latin-1, "
            "cp1252 or utf-16"
        ) from None
    return "utf-8-sig" if name == "utf-8" else encoding


def _decode_error(path: Path, encoding: str) -> DataError:
    """Where ``path`` stops being ``encoding``: its first undecodable byte, offset and line (read
    again from the start in blocks: only on the error path)."""
    decoder = codecs.getincrementaldecoder(_codec(encoding))()
    offset = lines = 0
    head = b""
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            head = head or block[:2]
            pending = len(decoder.getstate()[0])
            try:
                decoder.decode(block)
            except UnicodeDecodeError as err:
                data = err.object
                start = offset - pending + err.start
                line = lines + data[pending : max(err.start, pending)].count(b"\n") + 1
                where = f"byte 0x{data[err.start]:02x} at offset {start}, line {line}"
                break
            offset += len(block)
            lines += block.count(b"\n")
        else:
            where = "at its end"  # a sequence cut off by the end of the file
    if head[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        fix = "it starts with a UTF-16 byte-order mark: set data.encoding=utf-16"
    elif _codec(encoding) == "utf-8-sig":
        fix = "set data.encoding=latin-1 (or the file's encoding, e.g. cp1252)"
    else:
        fix = "set data.encoding=<the file's encoding>"
    return DataError(f"{path} is not {encoding} ({where}): {fix}")


@contextmanager
def open_text(path: Path, encoding: str = "utf-8", newline: str | None = "") -> Iterator[TextIO]:
    """``path`` open for reading as text; a byte that is not ``encoding`` anywhere in what is read
    inside the ``with`` is one :class:`DataError` naming its offset, line and the fix."""
    codec = _codec(encoding)
    try:
        with path.open(encoding=codec, newline=newline) as f:
            yield f
    except UnicodeDecodeError:
        raise _decode_error(path, encoding) from None


def too_long_text(where: str, chars: int | None = None) -> DataError:
    size = f"{chars:,} characters" if chars else f"over {MAX_TEXT_CHARS:,} characters"
    return DataError(
        f"{where}: a text of {size}, longer than the {MAX_TEXT_CHARS:,} laptrain reads: if a "
        "quote was left open there, close it; otherwise cut or split the text (only "
        "data.max_length tokens are used)"
    )


def _long_line(path: Path, number: int) -> DataError:
    return DataError(
        f"{path}:{number}: line {number} is over {MAX_LINE_CHARS:,} characters long; laptrain "
        f"reads texts of up to {MAX_TEXT_CHARS:,} characters: cut or split the text there (only "
        "data.max_length tokens are used), or end the rows with line breaks"
    )


def _lines(path: Path, f: TextIO) -> Iterator[str]:
    """The lines of ``f`` (line breaks kept), each read with the ``MAX_LINE_CHARS`` cap."""
    number = 0
    while line := f.readline(MAX_LINE_CHARS + 1):
        number += 1
        if len(line) > MAX_LINE_CHARS:
            raise _long_line(path, number)
        yield line


LINE_BREAK = re.compile(r"\r\n|\r|\n")


def line_breaks(text: str) -> int:
    return len(LINE_BREAK.findall(text)) if ("\n" in text or "\r" in text) else 0


def unclosed_quote(where: str, what: str) -> DataError:
    return DataError(
        f"{where}: a quote opened in this row {what}: close it where the text ends (a quote "
        'inside a quoted text is written "")'
    )


def csv_records(path: Path, encoding: str, delimiter: str) -> Iterator[tuple[int, list[str]]]:
    """``(first line, fields)`` of each non-blank record of a CSV file, the header first: streamed
    with ``strict`` quoting, fields capped at ``MAX_TEXT_CHARS``, lines at ``MAX_LINE_CHARS``. A
    quote left open is named at the line where it opened; a record is never cut or guessed at."""
    limit = csv.field_size_limit()
    csv.field_size_limit(MAX_TEXT_CHARS)
    start = 1
    header = 0
    try:
        with open_text(path, encoding, newline="") as f:
            reader = csv.reader(_lines(path, f), delimiter=delimiter, strict=True)
            try:
                for fields in reader:
                    first, start = start, reader.line_num + 1
                    if not fields or (len(fields) == 1 and not fields[0].strip()):
                        continue
                    if header and len(fields) < header and reader.line_num > first:
                        raise unclosed_quote(  # the first field with a line break opened on `first`
                            f"{path}:{first}",
                            f"runs on to line {reader.line_num}, leaving the row "
                            f"{len(fields)} of the header's {header} fields",
                        )
                    header = header or len(fields)
                    yield first, fields
            except csv.Error as err:
                if "field larger than field limit" in str(err):
                    raise too_long_text(f"{path}:{start}") from None
                if "unexpected end of data" in str(err):
                    raise unclosed_quote(f"{path}:{start}", "is never closed") from None
                if reader.line_num > start:  # the bad record began on an earlier line
                    raise unclosed_quote(
                        f"{path}:{start}",
                        f"runs on to line {reader.line_num} (broken CSV there: {err})",
                    ) from None
                raise DataError(
                    f"{path}:{reader.line_num}: broken CSV ({err}): quote the whole field, and "
                    'write a quote inside it as ""'
                ) from None
    finally:
        csv.field_size_limit(limit)


def parse_json(text: str) -> tuple[Any, str | None]:
    """``(value, None)``, or ``(None, why)`` for text that is not JSON (``why`` names the column)
    or nests deeper than the parser's recursion allows (``RecursionError``, not a traceback)."""
    try:
        return json.loads(text), None
    except json.JSONDecodeError as err:
        return None, f"not valid JSON ({err.msg}, column {err.colno})"
    except RecursionError:
        return None, TOO_DEEP


def json_lines(
    path: Path, encoding: str = "utf-8", text: str | None = None
) -> Iterator[tuple[int, Any, str | None]]:
    """``(line number, value, None)`` for each non-blank line of a JSON Lines file, or ``(line
    number, None, why)`` for one that is not JSON; streamed line by line (``MAX_LINE_CHARS``
    each) unless ``text`` is the file's contents, already read. Lines end at ``\\n`` only."""
    if text is not None:
        lines: Iterator[str] = _lines(path, io.StringIO(text, newline="\n"))
        for number, line in enumerate(lines, start=1):
            if line.strip():
                yield number, *parse_json(line)
        return
    with open_text(path, encoding, newline="\n") as f:
        for number, line in enumerate(_lines(path, f), start=1):
            if line.strip():
                yield number, *parse_json(line)


def read_parquet(path: Path) -> list[dict[str, Any]]:
    """A Parquet file's rows, or a :class:`DataError` (unreadable, or columns without rows)."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError with multi-line text
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataError(f"{path} is not a readable Parquet file ({first})") from None
    if table.num_rows == 0:
        raise DataError(
            f"{path} has columns ({', '.join(table.column_names)}) but no rows: add rows"
        )
    return table.to_pylist()


def read_text(path: Path, encoding: str = "utf-8") -> str:
    """A text data file's whole contents; an empty file or another encoding is a
    :class:`DataError`."""
    with open_text(path, encoding) as f:
        text = f.read()
    if not text.strip():
        raise DataError(f"{path} is empty: give it a header line and one row per text")
    return text
