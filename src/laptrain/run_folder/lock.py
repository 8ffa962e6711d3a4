"""One live process per run folder.

Gap filled: a rerun of the same command resumes in the same folder, so the command typed twice (or a
sweep rerun while the first is alive) has two processes writing one ``last.ckpt``, and neither Hydra
nor Lightning notices. The lock is ``<run folder>/.laptrain.lock`` held with ``fcntl.flock``: the
kernel drops it when the process ends, however it ends, so a lock left by a killed run is never
stale. Where the filesystem has no ``flock`` (some network mounts), the pid written in the file is
checked instead (same host only). Imported by the launcher before torch.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import IO

from laptrain.config.scale_out import extra_rank
from laptrain.files import pid_alive

LOCK_NAME = ".laptrain.lock"
_held: dict[str, IO[str]] = {}


class RunFolderBusy(OSError):
    """Another live laptrain process holds this run folder."""


def _holder_text(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return "another process"
    started = info.get("started")
    when = time.strftime("%H:%M", time.localtime(started)) if started else "?"
    return (
        f"pid {info.get('pid', '?')} on {info.get('host', '?')}, started {when}: "
        f"{info.get('command', '?')}"
    )


def _busy(folder: Path, path: Path) -> RunFolderBusy:
    return RunFolderBusy(
        errno.EBUSY,
        f"run folder {folder} is in use by another laptrain run ({_holder_text(path)}); wait for "
        "it to end, or start a separate run with resume=false (next free folder) or "
        "run_name=<another name>",
    )


def is_locked(folder: str | Path) -> bool:
    """Whether another live process holds ``folder`` (this process's own lock does not count)."""
    folder = Path(folder)
    path = folder / LOCK_NAME
    if str(folder.resolve()) in _held or not path.is_file():
        return False
    import fcntl

    with path.open("r") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return _pid_holder_alive(path)
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def _pid_holder_alive(path: Path) -> bool:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return False
    return info.get("host") == socket.gethostname() and pid_alive(int(info.get("pid", -1)))


def hold_run_folder(folder: str | Path, command: list[str] | None = None) -> bool:
    """Lock ``folder`` for this process (creating it); True if taken now, False if this process
    already held it or is an extra rank. Raises :class:`RunFolderBusy` with one line otherwise."""
    if extra_rank() or sys.platform == "win32":  # rank 0 holds the folder for all ranks
        return False
    folder = Path(folder)
    key = str(folder.resolve())
    if key in _held:
        return False
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    f = path.open("a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise _busy(folder, path) from None
    except OSError:  # no flock here (network filesystem): fall back on the recorded pid
        if _pid_holder_alive(path):
            f.close()
            raise _busy(folder, path) from None
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.time(),
        "command": " ".join(command if command is not None else sys.argv)[:300],
    }
    f.seek(0)
    f.truncate()
    f.write(json.dumps(info))
    f.flush()
    _held[key] = f
    return True


def release_run_folder(folder: str | Path) -> None:
    """Give ``folder`` back (sweep jobs run one after another in one process)."""
    f = _held.pop(str(Path(folder).resolve()), None)
    if f is not None:
        with contextlib.suppress(OSError):
            f.close()
