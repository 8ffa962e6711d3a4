"""Checkpoint bytes: written so that a kill at any instant leaves a loadable file, read with care.

Writing: Lightning 2.6.6's ``_atomic_save`` (lightning/fabric/utilities/cloud_io.py:85) copies a
temp file across filesystems and fsyncs nothing; :class:`AtomicCheckpointIO` writes beside the
target, fsyncs, renames and fsyncs the folder, and a full disk (torch's zip writer: a RuntimeError
with the ``OSError`` in its ``__context__``, torch/serialization.py:853) is one line
(docs/lightning.md, "Atomic saves"). Reading: ``weights_only=True`` with the config's objects
allowed (:mod:`.trusted`), also under FSDP, whose ``_lazy_load`` unpickles freely
(lightning/pytorch/strategies/fsdp.py:631; :func:`weights_only_under_fsdp`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from laptrain.checkpoints.trusted import RefusedGlobal, TrustedGlobals
from laptrain.console import exception_chain
from laptrain.files import fsync_dir

MB = 1024 * 1024
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# What torch's zip writer says when a write came up short (caffe2/serialize/inline_container.cc):
# the position check of ``ostream_write_func``, or ``valid()`` after a failed write.
SHORT_WRITE = re.compile(
    r"inline_container\.cc.*unexpected pos \d+|PytorchStreamWriter failed writing", re.DOTALL
)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the previous file at that path is intact."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves are write-temp-in-place, fsync, rename (see module),
    and whose loads allow the objects of ``trusted`` (held here: spawned ranks get it too)."""

    def __init__(self, trusted: TrustedGlobals | None = None) -> None:
        self.trusted = trusted or TrustedGlobals()

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        target = str(path)
        if "://" in target and not target.startswith("file://"):  # remote: Lightning's own way
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        target = target.removeprefix("file://")
        folder = os.path.dirname(os.path.abspath(target))
        os.makedirs(folder, exist_ok=True)
        temp = os.path.join(folder, f".{os.path.basename(target)}.{os.getpid()}.tmp")
        try:
            with open(temp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, target)
        except BaseException as err:
            _remove_quietly(temp)
            failed = write_failure(err) if isinstance(err, Exception) else None
            if failed is None:  # not the disk's doing (a bug, Ctrl-C): raised as it is
                raise
            free = f"{shutil.disk_usage(folder).free / MB:.0f} MB free in {folder}"
            if failed.errno in NO_SPACE:
                head = f"no space left to write checkpoint {target} ({free})"
            else:
                head = f"could not write checkpoint {target}: {failed.strerror} ({free})"
            raise CheckpointWriteError(
                failed.errno,
                f"{head}; the previous checkpoint there is intact. Free some space, or set "
                "paths.ckpt_dir=<folder on another disk>, and rerun the same command",
            ) from err
        fsync_dir(folder)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: Any = None) -> Any:
        # Lightning passes weights_only=None unless told; a run's checkpoints hold tensors, plain
        # values and what its config builds, so load them the safe way (without torch's warning).
        with self.trusted.loading(path):
            return super().load_checkpoint(
                path,
                map_location=map_location or (lambda storage, loc: storage),
                weights_only=True if weights_only is None else weights_only,
            )


def checkpoint_plugins(configured: Any, trusted: TrustedGlobals | None = None) -> list[Any]:
    """The trainer's plugins with laptrain's crash-safe checkpoint IO, unless one is given."""
    plugins = list(configured or [])
    if not any(isinstance(p, CheckpointIO) for p in plugins):
        plugins.append(AtomicCheckpointIO(trusted))
    return plugins


def weights_only_under_fsdp(strategy: Any) -> None:
    """Make Lightning's ``FSDPStrategy`` load full checkpoints with :func:`load_state`."""
    from lightning.pytorch.strategies import FSDPStrategy

    if isinstance(strategy, FSDPStrategy):
        strategy.load_checkpoint = functools.partial(_load_weights_only, strategy)


def _load_weights_only(strategy: Any, checkpoint_path: Any, weights_only: Any = None) -> Any:
    import lightning.pytorch.strategies.fsdp as lightning_fsdp

    trusted = getattr(strategy.checkpoint_io, "trusted", None)
    lazy = lightning_fsdp._lazy_load
    lightning_fsdp._lazy_load = functools.partial(load_state, trusted=trusted)
    try:
        return type(strategy).load_checkpoint(strategy, checkpoint_path, weights_only)
    finally:
        lightning_fsdp._lazy_load = lazy


def move_into_place(source: str | Path, target: str | Path) -> None:
    """Rename ``source`` over ``target`` (one folder: atomic on POSIX) and fsync the folder."""
    os.replace(source, target)
    fsync_dir(os.path.dirname(os.path.abspath(target)))


def write_failure(err: BaseException) -> OSError | None:
    """Why a checkpoint write failed, when the disk is to blame: the ENOSPC/EDQUOT ``OSError``
    anywhere behind ``err``; else, when torch's zip writer reported a short write, the ``OSError``
    behind it (or an EIO one where torch kept no errno); else None (raised as it is)."""
    chain = exception_chain(err)
    for current in chain:
        if isinstance(current, OSError) and current.errno in NO_SPACE:
            return current
    if not any(isinstance(c, RuntimeError) and SHORT_WRITE.search(str(c)) for c in chain):
        return None
    behind = [c for c in chain if isinstance(c, OSError) and c.errno and c.strerror]
    if behind:
        return behind[0]
    return OSError(errno.EIO, "torch's writer stopped short and the OS gave no reason")


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def leftover_temp_files(folder: str | Path) -> list[Path]:
    """Temporary files a killed save left behind (harmless; removed by :func:`clean_leftovers`)."""
    folder = Path(folder)
    return sorted(folder.glob(".*.ckpt.*.tmp")) if folder.is_dir() else []


def clean_leftovers(folder: str | Path) -> int:
    """Remove the temporary files of saves that a kill interrupted; returns how many."""
    leftovers = leftover_temp_files(folder)
    for path in leftovers:
        _remove_quietly(str(path))
    return len(leftovers)


def load_state(path: str | Path, trusted: TrustedGlobals | None = None) -> dict[str, Any]:
    """A checkpoint's contents, tensors memory-mapped (nothing is read until used), ``trusted``'s
    objects allowed; a refused global is one :class:`RefusedGlobal` line, torch's other errors as they are
    (:func:`read_checkpoint` turns them into one line)."""
    with (trusted or TrustedGlobals()).loading(path):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def checkpoint_step(path: str | Path, trusted: TrustedGlobals | None = None) -> tuple[int, int]:
    """(global step, epoch) stored in a Lightning checkpoint, read without loading the tensors."""
    state = load_state(path, trusted)
    return int(state.get("global_step", 0)), int(state.get("epoch", 0))


def read_checkpoint(path: str | Path, trusted: TrustedGlobals | None = None) -> dict[str, Any]:
    """A checkpoint's contents (memory-mapped, only ``trusted``'s objects allowed); one-line
    errors."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint not found: {path} (point ckpt_path= at a .ckpt file, "
            "e.g. outputs/<run>/checkpoints/last.ckpt)"
        )
    try:
        state = load_state(path, trusted)
    except RefusedGlobal:  # an object the config does not build, named with its fix
        raise
    except Exception as err:  # truncated zip, a pickle with objects, not a torch file at all
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"{path} is not a readable checkpoint ({path.stat().st_size} bytes; torch says: "
            f"{first[:160]}). Point ckpt_path= at another .ckpt (best-step*.ckpt beside it), "
            "or resume=false to start a new run"
        ) from err
    if not isinstance(state, dict) or "state_dict" not in state:
        raise ValueError(
            f"{path} is not a Lightning checkpoint (no state_dict); point ckpt_path= at a .ckpt "
            "file that laptrain wrote"
        )
    return state
