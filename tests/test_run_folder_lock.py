"""One live process per run folder: the second is refused at once; a dead holder frees it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from laptrain.run_folder.lock import (
    LOCK_NAME,
    RunFolderBusy,
    hold_run_folder,
    is_locked,
    release_run_folder,
)
from laptrain.run_folder.naming import choose_run_dir
from tests.conftest import TINY, write_texts
from tests.in_process import train_here

ROOT = Path(__file__).resolve().parents[1]


def holder(folder: Path) -> subprocess.Popen:
    """Another process that holds ``folder`` until it is killed."""
    code = (
        "import sys, time; from laptrain.run_folder.lock import hold_run_folder; "
        f"hold_run_folder({str(folder)!r}, ['python', 'train.py', 'run_name=t']); "
        "print('held', flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_folder_held_by_a_live_process_is_refused_naming_it_and_freed_when_it_dies(tmp_path):
    folder = tmp_path / "outputs" / "t"
    proc = holder(folder)
    try:
        assert is_locked(folder)
        with pytest.raises(RunFolderBusy) as err:
            hold_run_folder(folder)
        message = str(err.value)
        assert f"pid {proc.pid}" in message and "run_name=t" in message
        assert "resume=false" in message and "\n" not in message
    finally:
        proc.kill()
        proc.wait()
    # killed: the kernel dropped its flock; the file it left is not a stale lock
    assert (folder / LOCK_NAME).exists() and not is_locked(folder)
    assert hold_run_folder(folder) is True
    assert hold_run_folder(folder) is False  # already ours
    assert not is_locked(folder)  # our own lock does not count against us
    release_run_folder(folder)


def test_resume_false_skips_a_folder_a_live_run_holds_even_before_its_first_checkpoint(
    tmp_path,
):
    base = tmp_path / "outputs" / "t"
    proc = holder(base)
    try:
        assert choose_run_dir(str(base), False) == f"{base}-2"
    finally:
        proc.kill()
        proc.wait()


def test_extra_ranks_do_not_take_the_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert hold_run_folder(tmp_path / "r") is False
    assert not (tmp_path / "r" / LOCK_NAME).exists()


def test_train_py_on_a_busy_run_folder_stops_at_once_and_changes_nothing(tmp_path):
    data = write_texts(tmp_path / "texts.csv")
    folder = tmp_path / "outputs" / "t"
    proc = holder(folder)
    try:
        start = time.monotonic()
        done = train_here(
            ["hardware=cpu", "data=text_csv", f"data.files.train={data}", "run_name=t", *TINY],
            tmp_path,
        )
        took = time.monotonic() - start
    finally:
        proc.kill()
        proc.wait()
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"pid {proc.pid}" in errors[0], done.stderr[-2000:]
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]  # no .hydra, no train.log
    assert took < 60
