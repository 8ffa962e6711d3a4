"""The ground floor's file helpers: digests and atomic writes of a run folder's records."""

from __future__ import annotations

import hashlib

import pytest

from laptrain import files
from laptrain.files import file_digest, write_text_atomic


def test_a_record_is_replaced_whole_and_a_symlink_is_not_written_through(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text("keep")
    record = tmp_path / "run" / "preflight.json"
    record.parent.mkdir()
    record.symlink_to(outside)
    write_text_atomic(record, '{"micro_batch": 8}')
    assert record.read_text() == '{"micro_batch": 8}' and not record.is_symlink()
    assert outside.read_text() == "keep"
    assert sorted(p.name for p in record.parent.iterdir()) == ["preflight.json"]


def test_a_write_that_fails_leaves_the_old_record_and_no_temporary_file(tmp_path, monkeypatch):
    record = tmp_path / "metrics.json"
    record.write_text("old")

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_text_atomic(record, "new")
    assert record.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_file_digest_is_the_sha256_of_the_bytes(tmp_path):
    path = tmp_path / "data.csv"
    path.write_bytes(b"text,label\n" * 100_000)
    assert file_digest(path) == hashlib.sha256(path.read_bytes()).hexdigest()
