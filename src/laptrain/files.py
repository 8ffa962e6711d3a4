"""Small file and process helpers shared by every floor (no torch, no laptrain imports).

- :func:`file_digest`: a file's sha256, streamed (data-file stamps, model-cache manifests).
- :func:`fsync_dir`: make a rename in a folder durable (checkpoints, adapter folders, caches).
- :func:`pid_alive`: whether a process id is alive on this host (run-folder lock, stale caches).
- :func:`write_text_atomic`: a run folder's records (``preflight.json``, ``run_info.json``,
  ``metrics.json``, the report) replaced whole, never left half-written by a kill.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def file_digest(path: Path) -> str:
    """The sha256 of ``path``'s bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fsync_dir(folder: str | Path) -> None:
    """Make a rename in ``folder`` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader (or a kill) sees the old file or the new one, never
    half of one: a temporary file in the same folder (``os.replace`` is atomic only within one
    filesystem), then the rename. A symlink at ``path`` is replaced, not followed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
