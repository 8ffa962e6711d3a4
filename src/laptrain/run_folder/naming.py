"""Where a run lives: ``outputs/<run_name>/``, named by the run, not the clock, so a rerun resumes;
with ``resume=false`` the new run gets ``<run_name>-2``, ``-3``... Imported before torch."""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

from omegaconf import OmegaConf

from laptrain.checkpoints.last import last_checkpoint
from laptrain.run_folder.lock import LOCK_NAME, is_locked, launch_of

_chosen: dict[str, str] = {}
# How long a rank waits for the holder record of a lock taken a moment ago (written just after it).
RECORD_WAIT_S = 2.0


def holds_run(folder: Path) -> bool:
    """Whether ``folder`` holds a run's checkpoints or curves, or a live run of another launch."""
    if not folder.is_dir():
        return False
    return (
        any(folder.rglob("*.ckpt"))
        or any(folder.rglob("events.out.tfevents.*"))
        or _held_by_another_launch(folder)
    )


def _held_by_another_launch(folder: Path) -> bool:
    """Locked by a live process that is not rank 0 of this very launch.

    torchrun and srun ranks each resolve the run folder (Hydra, before any process group): a rank
    finding rank 0's fresh lock went on to ``<run>-N+1``. The holder record names its launch
    (:func:`laptrain.run_folder.lock.launch_of`), the same for every rank of one launch."""
    if not is_locked(folder):
        return False
    mine = launch_of()
    return mine is None or _holder_launch(folder) != mine


def _holder_launch(folder: Path) -> str | None:
    path, deadline = folder / LOCK_NAME, time.monotonic() + RECORD_WAIT_S
    while True:
        try:
            record = json.loads(path.read_text() or "null")
        except (OSError, ValueError):
            record = None
        if isinstance(record, dict) and "launch" in record:
            return record["launch"]
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def choose_run_dir(base: str, resume: object) -> str:
    """``base`` when resuming (or when it is new); otherwise the first free ``base-N``, remembered:
    Hydra resolves the folder again for every job of a sweep."""
    if str(resume).lower() in ("true", "1", "yes"):
        return base
    if base not in _chosen:
        candidate, n = base, 1
        while holds_run(Path(candidate)):
            n += 1
            candidate = f"{base}-{n}"
        _chosen[base] = candidate
    return _chosen[base]


# Most file systems refuse names over 255 bytes; an Optuna trial's overrides easily pass that.
JOB_DIR_MAX = 240


def job_dir(override_dirname: str) -> str:
    """A sweep job's folder name from its overrides: one level, never empty; over ``JOB_DIR_MAX``
    bytes, numbers to 4 digits and a hash of the full name (the same for the same overrides)."""
    name = override_dirname.replace("/", "_").replace("\\", "_") or "default"
    if len(name.encode()) <= JOB_DIR_MAX:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    short = re.sub(r"(?<==)-?\d+\.\d+(?:e-?\d+)?(?=,|$)", lambda m: f"{float(m[0]):.4g}", name)
    return f"{short.encode()[: JOB_DIR_MAX - 9].decode(errors='ignore')}-{digest}"


def register_resolvers() -> None:
    """Register the ``laptrain_run_dir``, ``laptrain_job_dir`` and ``laptrain_last_ckpt``
    resolvers."""
    OmegaConf.register_new_resolver(
        "laptrain_run_dir", choose_run_dir, use_cache=True, replace=True
    )
    OmegaConf.register_new_resolver("laptrain_job_dir", job_dir, replace=True)
    OmegaConf.register_new_resolver(
        "laptrain_last_ckpt", lambda ckpt_dir: str(last_checkpoint(ckpt_dir)), replace=True
    )
