"""The ground floor's file helpers: digests and atomic writes of a run folder's records."""

from __future__ import annotations

import hashlib
from pathlib import Path

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


def test_an_export_is_swapped_in_whole_and_a_failed_one_leaves_the_old(tmp_path):
    from laptrain.files import write_folder_atomic

    def good(folder: Path) -> None:
        folder.mkdir()
        (folder / "config.json").write_text("{}")

    target = write_folder_atomic(tmp_path / "model", good)
    (target / "stale.bin").write_text("from the last export")

    def dies(folder: Path) -> None:
        folder.mkdir()
        (folder / "config.json").write_text("{")
        raise KeyboardInterrupt  # a kill in the middle of writing

    with pytest.raises(KeyboardInterrupt):
        write_folder_atomic(target, dies)
    assert (target / "stale.bin").is_file()  # the old export, untouched
    assert not list(tmp_path.glob(".*"))  # no partial folder left
    write_folder_atomic(target, good)
    assert sorted(p.name for p in target.iterdir()) == ["config.json"]  # replaced whole


def test_an_export_replaces_a_symlink_and_refuses_a_users_folder(tmp_path):
    from laptrain.files import write_folder_atomic

    def good(folder: Path) -> None:
        folder.mkdir()
        (folder / "config.json").write_text("{}")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "run" / "model"
    link.parent.mkdir()
    link.symlink_to(elsewhere)
    write_folder_atomic(link, good)
    assert not link.is_symlink() and (link / "config.json").is_file()
    assert not any(elsewhere.iterdir())  # nothing written through the link
    mine = tmp_path / "my_notes"
    mine.mkdir()
    (mine / "todo.txt").write_text("keep me")
    with pytest.raises(ValueError, match="is not an exported model folder"):
        write_folder_atomic(mine, good)
    assert (mine / "todo.txt").read_text() == "keep me"
