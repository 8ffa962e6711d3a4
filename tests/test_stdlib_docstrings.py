import json
from pathlib import Path

import pytest

from laptrain.families.classifier.stdlib_docstrings import build_stdlib_docstrings, collect_examples

FAMILIES = {"text": ["textwrap", "string"], "numbers": ["fractions", "statistics"]}


def test_docstrings_are_real_text_labelled_by_family():
    rows = collect_examples(FAMILIES)
    assert {r["label"] for r in rows} == {"text", "numbers"}
    assert any("fraction" in r["text"].lower() for r in rows if r["label"] == "numbers")
    assert all(len(r["text"]) >= 20 for r in rows)
    assert len({r["text"] for r in rows}) == len(rows)


def test_corpus_is_written_once_and_reused(tmp_path):
    first = build_stdlib_docstrings(str(tmp_path), FAMILIES)["all"]
    stamp = (tmp_path / "stdlib_docstrings").stat().st_mtime_ns
    assert build_stdlib_docstrings(str(tmp_path), FAMILIES)["all"] == first
    assert (tmp_path / "stdlib_docstrings").stat().st_mtime_ns == stamp
    rows = [json.loads(line) for line in Path(first).read_text().splitlines()]
    assert rows and set(rows[0]) == {"text", "label", "module"}
    assert build_stdlib_docstrings(str(tmp_path), {"text": ["textwrap"]})["all"] != first


def test_empty_family_map_names_the_config_file(tmp_path):
    with pytest.raises(ValueError, match="stdlib_docstrings.yaml"):
        build_stdlib_docstrings(str(tmp_path), {})
