"""Crash-safe checkpoint writes, disk full, and checkpoints that do not fit the model."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import laptrain.checkpoints.checkpoint_io as files
from laptrain.checkpoints.checkpoint_io import (
    AtomicCheckpointIO,
    CheckpointWriteError,
    clean_leftovers,
    leftover_temp_files,
    read_checkpoint,
)
from laptrain.checkpoints.resume import check_resume_checkpoint
from tests.conftest import TINY, run_train, write_texts
from tests.disk_full import open_dev_full, open_full

ROOT = Path(__file__).resolve().parents[1]


def checkpoint(value: float, n: int = 50_000) -> dict:
    return {"global_step": int(value), "state_dict": {"w": torch.full((n,), value)}}


def test_a_save_replaces_the_file_and_leaves_no_temporary(tmp_path):
    io = AtomicCheckpointIO()
    target = tmp_path / "ckpt" / "last.ckpt"
    io.save_checkpoint(checkpoint(1), target)
    io.save_checkpoint(checkpoint(2), target)
    assert read_checkpoint(target)["global_step"] == 2
    assert leftover_temp_files(target.parent) == []
    assert io.load_checkpoint(target)["state_dict"]["w"][0] == 2  # weights_only load


@pytest.mark.parametrize("moment", ["while-writing", "before-rename"])
def test_sigkill_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path, moment):
    """A process killed with SIGKILL in the middle of the bytes, or between the write and the
    rename, leaves last.ckpt as it was; the rerun's clean-up removes the partial temporary file."""
    target = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(checkpoint(1), target)
    child = textwrap.dedent(
        f"""
        import os, signal, torch
        import laptrain.checkpoints.checkpoint_io as cf
        moment = {moment!r}
        if moment == "while-writing":
            real = torch.save
            def save(obj, f):
                f.write(b"partial bytes")
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            cf.torch.save = save
        else:
            cf.os.replace = lambda a, b: os.kill(os.getpid(), signal.SIGKILL)
        cf.AtomicCheckpointIO().save_checkpoint(
            {{"global_step": 2, "state_dict": {{"w": torch.full((50000,), 2.0)}}}}, {str(target)!r}
        )
        """
    )
    done = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True)
    assert done.returncode == -9, done.stderr[-2000:]
    assert read_checkpoint(target)["global_step"] == 1  # the previous one, whole
    assert len(leftover_temp_files(tmp_path)) == 1
    assert clean_leftovers(tmp_path) == 1 and leftover_temp_files(tmp_path) == []


def test_disk_full_names_the_folder_and_its_free_space_and_keeps_the_previous_file(
    tmp_path, monkeypatch
):
    target = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint(checkpoint(1), target)

    def full_disk(obj, f):
        f.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("laptrain.checkpoints.checkpoint_io.torch.save", full_disk)
    with pytest.raises(CheckpointWriteError) as err:
        io.save_checkpoint(checkpoint(2), target)
    message = str(err.value)
    assert str(tmp_path) in message and "MB free" in message and "paths.ckpt_dir=" in message
    assert "\n" not in message
    assert read_checkpoint(target)["global_step"] == 1
    assert leftover_temp_files(tmp_path) == []


@pytest.mark.parametrize("disk", ["unbuffered", "buffered", "dev-full"])
def test_a_real_full_disk_inside_torch_save_is_the_one_line_no_space_error(
    tmp_path, monkeypatch, disk
):
    """The real serialiser on a full disk: torch.save's zip writer turns the write's OSError(ENOSPC)
    into ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos ...`` with the
    OSError only in ``__context__`` (unbuffered), or the file's close raises ENOSPC again over it
    (buffered; /dev/full, where the kernel itself answers ENOSPC)."""
    target = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint(checkpoint(1), target)
    if disk == "dev-full":
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full on this OS")
        opener = open_dev_full
    else:
        opener = open_full(room=5000, buffered=disk == "buffered")
    monkeypatch.setattr(files, "open", opener, raising=False)
    with pytest.raises(CheckpointWriteError) as err:
        io.save_checkpoint(checkpoint(2), target)
    message = str(err.value)
    assert err.value.errno == errno.ENOSPC and "\n" not in message
    assert message.startswith("[Errno 28] no space left to write checkpoint")
    assert f"MB free in {tmp_path}" in message and "paths.ckpt_dir=" in message
    monkeypatch.undo()
    assert leftover_temp_files(tmp_path) == []
    assert read_checkpoint(target)["global_step"] == 1  # the previous one, whole
    assert io.load_checkpoint(target)["state_dict"]["w"][0] == 1


def test_the_unbuffered_full_disk_really_reaches_torch_as_inline_containers_error(tmp_path):
    """What the test above stands on (torch 2.13): the serialiser's own error is the RuntimeError,
    and the ENOSPC is only behind it."""
    with (
        open_full(room=5000)(str(tmp_path / "x"), "wb") as f,
        pytest.raises(RuntimeError, match=r"inline_container\.cc.*unexpected pos") as err,
    ):
        torch.save(checkpoint(2), f)
    assert isinstance(err.value.__context__, OSError)
    assert err.value.__context__.errno == errno.ENOSPC


def test_a_short_write_with_no_errno_is_one_line_too(tmp_path, monkeypatch):
    target = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint(checkpoint(1), target)

    def short(obj, f):
        f.write(b"x" * 1000)
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr("laptrain.checkpoints.checkpoint_io.torch.save", short)
    with pytest.raises(CheckpointWriteError, match="torch's writer stopped short") as err:
        io.save_checkpoint(checkpoint(2), target)
    assert "MB free in" in str(err.value) and "\n" not in str(err.value)
    assert leftover_temp_files(tmp_path) == [] and read_checkpoint(target)["global_step"] == 1


def test_other_errors_of_a_save_are_raised_as_they_are(tmp_path, monkeypatch):
    def bug(obj, f):
        raise RuntimeError("a bug, not the disk")

    monkeypatch.setattr("laptrain.checkpoints.checkpoint_io.torch.save", bug)
    with pytest.raises(RuntimeError, match="a bug, not the disk"):
        AtomicCheckpointIO().save_checkpoint(checkpoint(2), tmp_path / "last.ckpt")
    assert leftover_temp_files(tmp_path) == []


def test_a_full_disk_mid_run_stops_train_py_with_exit_2_and_keeps_last_ckpt(tmp_path):
    """Through `python train.py`: epoch 1 checkpoints, then the disk fills up (tests/disk_full.py
    in the child); the run ends with one `error:` line, exit 2, epoch 1's last.ckpt loadable and
    no temporary file left."""
    data = write_texts(tmp_path / "texts.csv", rows=96)
    args = [
        "hardware=cpu",
        "data=text_csv",
        *TINY,
        f"data.files.train={data}",
        "trainer.max_epochs=2",
        "test=false",
        "logger=none",
        "run_name=full",
        "+callbacks.full._target_=tests.disk_full.DiskFullFrom",
        "+callbacks.full.epoch=1",
    ]
    done = run_train(args, tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr[-3000:]
    ckpts = tmp_path / "outputs" / "full" / "checkpoints"
    assert "no space left to write checkpoint" in errors[0] and f"MB free in {ckpts}" in errors[0]
    assert "Traceback" not in done.stderr
    assert read_checkpoint(ckpts / "last.ckpt")["epoch"] == 0  # epoch 1's, whole
    assert leftover_temp_files(ckpts) == []


def test_a_truncated_checkpoint_is_refused_in_one_line(tmp_path):
    whole = tmp_path / "whole.ckpt"
    AtomicCheckpointIO().save_checkpoint(checkpoint(1), whole)
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(ValueError, match="is not a readable checkpoint") as err:
        read_checkpoint(cut)
    assert "\n" not in str(err.value) and "best-step" in str(err.value)


def test_a_checkpoint_of_another_model_is_refused_naming_the_difference(tmp_path):
    path = tmp_path / "other.ckpt"
    small = torch.nn.Linear(4, 3)
    torch.save({"state_dict": small.state_dict()}, path)
    check_resume_checkpoint(path, small, "ckpt_path")  # its own model: accepted
    with pytest.raises(ValueError, match=r"another model: 1 weights have other shapes") as err:
        check_resume_checkpoint(path, torch.nn.Linear(8, 3), "ckpt_path")
    assert "weight: (3, 4) in the file, (3, 8) in this model" in str(err.value)
    assert "resume=false" in str(err.value)
    with pytest.raises(ValueError, match="are not this model's"):
        check_resume_checkpoint(path, torch.nn.Sequential(torch.nn.Linear(4, 3)), "ckpt_path")


def test_an_adapter_only_checkpoint_fits_a_module_that_loads_non_strictly(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    path = tmp_path / "adapters.ckpt"
    torch.save({"state_dict": {"1.weight": model[1].weight.detach()}}, path)
    with pytest.raises(ValueError, match="missing"):
        check_resume_checkpoint(path, model, "ckpt_path")
    model.strict_loading = False  # what causal_lm_lora sets: checkpoints hold the adapters only
    check_resume_checkpoint(path, model, "ckpt_path")


def test_leftovers_are_only_laptrain_temporaries(tmp_path):
    (tmp_path / "best-step3.ckpt").write_bytes(b"x")
    (tmp_path / f".last.ckpt.{os.getpid()}.tmp").write_bytes(b"x")
    assert [p.name for p in leftover_temp_files(tmp_path)] == [f".last.ckpt.{os.getpid()}.tmp"]
    clean_leftovers(tmp_path)
    assert (tmp_path / "best-step3.ckpt").exists()
