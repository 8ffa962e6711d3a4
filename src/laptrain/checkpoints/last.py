"""Where a run's ``last.ckpt`` is: Lightning's ``<dirpath>/last.ckpt`` (``CHECKPOINT_NAME_LAST``),
given to the config by the ``${laptrain_last_ckpt:<ckpt_dir>}`` resolver (``paths.last_ckpt``) and
to code that has a run folder by :func:`run_last_checkpoint`. Every save there goes through
:mod:`.stop`."""

from __future__ import annotations

from pathlib import Path

CHECKPOINTS = "checkpoints"  # paths.ckpt_dir's default, inside the run folder
LAST = "last"  # lightning.pytorch.callbacks.ModelCheckpoint.CHECKPOINT_NAME_LAST
SUFFIX = ".ckpt"  # ModelCheckpoint.FILE_EXTENSION


def last_checkpoint(ckpt_dir: str | Path) -> Path:
    """The checkpoint a rerun resumes from, in the checkpoint folder ``ckpt_dir``."""
    return Path(ckpt_dir) / f"{LAST}{SUFFIX}"


def run_last_checkpoint(run_folder: str | Path) -> Path:
    """:func:`last_checkpoint` of a run folder that keeps the default ``paths.ckpt_dir``."""
    return last_checkpoint(Path(run_folder) / CHECKPOINTS)
