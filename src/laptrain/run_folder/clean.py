"""``laptrain runs clean A [B ...]``: remove the named run folders and say how much space that
freed. Unlike ``rm -rf``, every name is checked first (a run folder under ``--root``, not a
symlink or the root, no live process holding its lock); one refusal removes nothing (exit 2).
Each folder is locked while it is removed, and a symlink inside is removed, never its target."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from laptrain.run_folder.compare import run_label
from laptrain.run_folder.listing import resolve_run, run_state
from laptrain.run_folder.lock import (
    RunFolderBusy,
    hold_run_folder,
    is_locked,
    lock_holder,
    release_run_folder,
)

MISSING = "—"


def folder_bytes(folder: Path) -> int:
    """The bytes of the regular files under ``folder`` (symlinks not followed, hard links once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for top, _, files in os.walk(folder, followlinks=False):
        for name in files:
            try:
                info = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    return total


def human_bytes(n: int) -> str:
    """``1.2 MiB``: binary units (2^10, 2^20, 2^30 bytes), as the run report's ``*_mb`` are."""
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class Removal:
    folder: Path
    label: str
    line: str  # "outputs/a: done, step 4, 1.2 MB"
    size: int


def check_run(name: str, root: Path) -> Removal:
    """The run ``name`` names, checked for removal; ValueError with the one-line reason if refused."""
    folder = resolve_run(name, root)  # a run holds .hydra/, checkpoints/, report.json or its lock
    if folder.is_symlink():
        raise ValueError(f"{folder} is a symlink (to {os.readlink(folder)}), not a run folder")
    real, home = folder.resolve(), root.resolve()
    if real == home or not real.is_relative_to(home):
        raise ValueError(f"{folder} is not a run under {root}/ (--root chooses where runs live)")
    if is_locked(folder):
        raise ValueError(f"{folder} is a live run: {lock_holder(folder)}")
    state = run_state(folder)
    size = folder_bytes(folder)
    step = MISSING if state.step is None else state.step
    label = run_label(folder, root)
    return Removal(
        folder, label, f"{label}: {state.status}, step {step}, {human_bytes(size)}", size
    )


def clean_command(names: Sequence[str], root: str | Path, dry_run: bool = False) -> int:
    """Remove the named runs (or, with ``dry_run``, say what would go); 2 if any is refused."""
    root = Path(root)
    removals, refusals = [], []
    for name in dict.fromkeys(names):
        try:
            removals.append(check_run(name, root))
        except ValueError as err:
            refusals.append(str(err))
    if refusals:
        for reason in refusals:
            print(f"error: {reason}; nothing removed", file=sys.stderr)
        return 2
    freed = 0
    for done, removal in enumerate(removals):
        if dry_run:
            print(f"{removal.line}: would be removed")
            freed += removal.size
            continue
        try:
            hold_run_folder(removal.folder, ["laptrain", "runs", "clean", removal.label])
        except RunFolderBusy:  # a run started since the check
            reason = f"{removal.folder} is a live run: {lock_holder(removal.folder)}"
            print(f"error: {reason}; not removed", file=sys.stderr)
            _freed_line(freed, done, dry_run)
            return 2
        try:
            shutil.rmtree(removal.folder)
        except OSError as err:
            print(f"error: removing {removal.folder}: {err}", file=sys.stderr)
            _freed_line(freed, done, dry_run)
            return 1
        finally:
            release_run_folder(removal.folder)
        freed += removal.size
        print(f"{removal.line}: removed")
    _freed_line(freed, len(removals), dry_run)
    return 0


def _freed_line(freed: int, runs: int, dry_run: bool) -> None:
    what = f"{human_bytes(freed)} ({freed:,} bytes) from {runs} run{'s' if runs != 1 else ''}"
    print(f"would free {what} (--dry-run: nothing removed)" if dry_run else f"freed {what}")
