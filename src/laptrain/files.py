"""Small file and process helpers shared by every floor (no torch, no laptrain imports): a streamed
sha256, a durable rename, whether a pid is alive, and atomic writes of a file or a whole folder."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# A full disk as the Rust writers (safetensors, tokenizers) report it: std::io::Error's text,
# e.g. SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
RUST_NO_SPACE = re.compile(rf"\(os error ({'|'.join(str(n) for n in NO_SPACE)})\)")
# What makes a folder inside a run one its training wrote, and so one it may replace whole.
EXPORT_MARKERS = ("config.json", "adapter_config.json", "Modelfile")


def file_digest(path: Path) -> str:
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


def fsync_file(path: str | Path) -> None:
    """Flush ``path``'s written bytes to the disk before it is renamed into place."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
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


def disk_full(err: BaseException) -> bool:
    """Whether a full disk (or quota) is behind ``err``: an ENOSPC/EDQUOT ``OSError`` anywhere in
    its ``__cause__``/``__context__`` chain, or a Rust writer's error saying so (safetensors'
    ``SafetensorError`` is a plain ``Exception`` with the OS error in its text)."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in NO_SPACE:
            return True
        if RUST_NO_SPACE.search(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


def write_folder_atomic(
    target: str | Path,
    write: Callable[[Path], object],
    replace: bool = False,
    fix: str = "free some space and rerun",
) -> Path:
    """``write(folder)`` into ``.<name>.partial`` beside ``target``, then swap it in: a kill leaves
    the old ``target``. An existing one is replaced only when empty or an earlier export
    (``EXPORT_MARKERS``); a full disk is one line ending with ``fix``."""
    target = Path(target)
    if not replace and _foreign_folder(target):
        raise ValueError(
            f"{target} exists and is not an exported model folder (no "
            f"{' or '.join(EXPORT_MARKERS)}): "
            "choose another output folder, or empty this one"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.parent / f".{target.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        write(partial)
    except BaseException as err:
        shutil.rmtree(partial, ignore_errors=True)
        if not isinstance(err, Exception) or not disk_full(err):
            raise
        free = shutil.disk_usage(target.parent).free / 1024**2
        raise OSError(
            errno.ENOSPC,
            f"no space left to write {target} ({free:.0f} MiB free in {target.parent}); nothing "
            f"half-written is left there: {fix}",
        ) from err
    old = target.parent / f".{target.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if target.is_symlink():
        target.unlink()
    elif target.exists():
        target.rename(old)
    partial.rename(target)
    fsync_dir(target.parent)
    shutil.rmtree(old, ignore_errors=True)
    return target


def _foreign_folder(target: Path) -> bool:
    """A file, or a real non-empty folder no export wrote (it holds none of ``EXPORT_MARKERS``);
    a symlink is not foreign: it is replaced, never followed."""
    if target.is_symlink() or not target.exists():
        return False
    if not target.is_dir():
        return True
    return any(target.iterdir()) and not any((target / n).is_file() for n in EXPORT_MARKERS)
