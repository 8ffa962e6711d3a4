"""Small file and process helpers shared by every floor (no torch, no laptrain imports).

- :func:`file_digest`: a file's sha256, streamed (data-file stamps, model-cache manifests).
- :func:`fsync_dir`: make a rename in a folder durable (checkpoints, adapter folders, caches).
- :func:`pid_alive`: whether a process id is alive on this host (run-folder lock, stale caches).
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
