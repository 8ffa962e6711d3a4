"""Test-only: a disk that fills up, for checkpoint writes (in-process and through train.py).

``FillsUp`` is a real file whose ``write`` raises ``OSError(ENOSPC)`` once ``room`` bytes are in
it, as ``write(2)`` does on a full disk; ``torch.save`` writes into it through its real serialiser.
``DiskFullFrom`` is a callback that makes every checkpoint write from epoch ``epoch`` (counted from
0) land on such a disk, by giving ``laptrain.checkpoints.checkpoint_io`` an ``open`` of its own.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
from typing import Any

import lightning.pytorch as pl

import laptrain.checkpoints.checkpoint_io as checkpoint_files


class FillsUp(io.FileIO):
    """An unbuffered file on a disk with ``room`` bytes left."""

    def __init__(self, path: str, room: int) -> None:
        super().__init__(path, "wb")
        self.room = room

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        if size > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= size
        return super().write(data)


def open_full(room: int, buffered: bool = False) -> Any:
    """An ``open`` whose files for writing sit on a disk with ``room`` bytes left."""

    def opener(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "w" not in mode:
            return builtins.open(path, mode, *args, **kwargs)
        raw = FillsUp(os.fspath(path), room)
        return io.BufferedWriter(raw) if buffered else raw

    return opener


def open_dev_full(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
    """An ``open`` that writes to Linux's /dev/full (every write: ENOSPC from the kernel) instead."""
    return builtins.open("/dev/full" if "w" in mode else path, mode, *args, **kwargs)


class DiskFullFrom(pl.Callback):
    """From epoch ``epoch`` on, checkpoint files are written to a disk with ``room`` bytes left."""

    def __init__(self, epoch: int = 1, room: int = 4096) -> None:
        self.epoch, self.room = epoch, room

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch >= self.epoch:
            checkpoint_files.open = open_full(self.room)  # type: ignore[attr-defined]
