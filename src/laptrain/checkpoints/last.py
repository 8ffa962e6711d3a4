"""Where a run's ``last.ckpt`` is: the one place its path is built and looked up.

The name is Lightning's own: ``ModelCheckpoint(save_last=True)`` writes ``<dirpath>/last.ckpt``
(``CHECKPOINT_NAME_LAST``). ``conf/paths/default.yaml`` gets it through the
``${laptrain_last_ckpt:<ckpt_dir>}`` resolver (``paths.last_ckpt``), code that has only a run
folder (``laptrain runs``, the run report) through :func:`run_last_checkpoint`.

A run has one ``last.ckpt``, and every save laptrain makes there (a stop, a checkpoint on request,
the end of fit) goes through :mod:`.stop`, which the job tells where it is (``paths.last_ckpt``).
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
