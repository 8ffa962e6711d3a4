"""One live process per run folder (``<run folder>/.laptrain.lock``, filelock's ``flock``: dropped
by the kernel however the process ends), with the line a refused run prints."""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from filelock import FileLock, Timeout

from laptrain.config.secrets import masked_argument
from laptrain.ranks.environment import extra_rank

LOCK_NAME = ".laptrain.lock"
_held: dict[str, FileLock] = {}
_made: set[str] = set()  # folders this process created when it took them


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


def lock_holder(folder: str | Path) -> str:
    """Who holds ``folder``'s lock, as written when it was taken: ``pid N on host, started HH:MM:
    command`` (``another process`` where the lock file holds no record)."""
    return _holder_text(Path(folder) / LOCK_NAME)


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
    probe = FileLock(path, timeout=0)
    try:
        probe.acquire()
    except Timeout:
        return True
    probe.release()
    return False


def launch_of(environ: Mapping[str, str] | None = None) -> str | None:
    """What every rank of one multi-process launch shares and no other launch does, recorded with
    the holder so that naming.choose_run_dir can tell rank 0's lock from another run's: torchrun's
    ``TORCHELASTIC_RUN_ID`` (a fresh uuid under ``--standalone``) with its master address and port,
    else SLURM's ``SLURM_JOB_ID``.``SLURM_STEP_ID`` (every srun task of the step). None for one
    process and for the ranks Lightning starts itself, which are given rank 0's folder."""
    env = os.environ if environ is None else environ
    if env.get("TORCHELASTIC_RUN_ID"):
        master = f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
        return f"torchrun {env['TORCHELASTIC_RUN_ID']} {master}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm {env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '')}"
    return None


def _record_holder(command: list[str] | None) -> Callable[[int], None]:
    """filelock's ``on_acquired``: write who holds the folder into the lock file, for the line a
    second process prints, credentials masked (laptrain.config.secrets). Only into a native lock's
    descriptor (re-locking it succeeds): with filelock's pid-marker fallback the file is filelock's
    own record and is left alone."""
    argv = command if command is not None else sys.argv
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.time(),
        "command": " ".join(map(masked_argument, argv))[:300],
        "launch": launch_of(),
    }

    def write(fd: int) -> None:
        import fcntl  # POSIX only; no run-folder lock on Windows (hold_run_folder)

        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)

    return write


def hold_run_folder(folder: str | Path, command: list[str] | None = None) -> bool:
    """Lock ``folder`` for this process (creating it); True if taken now, False if this process
    already held it or is an extra rank. Raises :class:`RunFolderBusy` with one line otherwise."""
    if extra_rank() or sys.platform == "win32":  # rank 0 holds the folder for all ranks
        return False
    folder = Path(folder)
    key = str(folder.resolve())
    if key in _held:
        return False
    if not folder.exists():
        _made.add(key)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    lock = FileLock(path, timeout=0, on_acquired=_record_holder(command))
    try:
        lock.acquire()
    except Timeout:
        raise _busy(folder, path) from None
    _held[key] = lock
    return True


def made_here(folder: str | Path) -> bool:
    """Whether this process created ``folder`` when it took it (a first run, not a rerun)."""
    return str(Path(folder).resolve()) in _made


def release_run_folder(folder: str | Path) -> None:
    """Give ``folder`` back (sweep jobs run one after another in one process)."""
    key = str(Path(folder).resolve())
    _made.discard(key)
    lock = _held.pop(key, None)
    if lock is not None:
        lock.release()
