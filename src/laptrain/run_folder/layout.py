"""Where a run keeps its checkpoints: the one place the resume checkpoint's path is built.

``conf/paths/default.yaml`` gets it through the ``${laptrain_last_ckpt:<ckpt_dir>}`` resolver, the
stopping callbacks through ``paths.last_ckpt``, and code that has only a run folder (``laptrain
runs``, the run report) through :func:`run_last_checkpoint`. The name is Lightning's own:
``ModelCheckpoint(save_last=True)`` writes ``<dirpath>/last.ckpt`` (``CHECKPOINT_NAME_LAST``).
"""

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
