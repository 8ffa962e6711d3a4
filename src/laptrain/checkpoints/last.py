"""Where a run's ``last.ckpt`` is: the one place its path is built and looked up.

The name is Lightning's own: ``ModelCheckpoint(save_last=True)`` writes ``<dirpath>/last.ckpt``
(``CHECKPOINT_NAME_LAST``). ``conf/paths/default.yaml`` gets it through the
``${laptrain_last_ckpt:<ckpt_dir>}`` resolver (``paths.last_ckpt``), code that has only a run
folder (``laptrain runs``, the run report) through :func:`run_last_checkpoint`.

A run has one ``last.ckpt``, and every save laptrain makes there (a stop, a checkpoint on request,
the end of fit) asks :func:`last_checkpoint_of` for it: the job tells the Trainer it builds once
(:func:`use_last_checkpoint`, ``paths.last_ckpt``), so no guard has a path of its own in the config
(:func:`refuse_guard_paths` names the keys that once set one). A Trainer the job did not build (a
test, a plain Lightning script) takes the path a callback was given in Python (its ``last_ckpt``).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from laptrain.config.errors import ConfigError

CHECKPOINTS = "checkpoints"  # paths.ckpt_dir's default, inside the run folder
LAST = "last"  # lightning.pytorch.callbacks.ModelCheckpoint.CHECKPOINT_NAME_LAST
SUFFIX = ".ckpt"  # ModelCheckpoint.FILE_EXTENSION

# The keys laptrain's guards took for a path of their own before paths.last_ckpt was the only one:
# a config that still sets one is refused, naming it (a guard would silently save elsewhere).
RETIRED_KEYS: dict[str, tuple[str, ...]] = {
    "laptrain.callbacks.graceful_stop.GracefulStop": ("dirpath", "filename"),
    "laptrain.callbacks.session_budget.SessionBudget": ("ckpt_path",),
    "laptrain.callbacks.memory_monitor.MemoryMonitor": ("ckpt_path",),
    "laptrain.callbacks.power_guard.PowerGuard": ("ckpt_path",),
    "laptrain.callbacks.nonfinite_guard.NonFiniteGuard": ("last_ckpt",),
}

_RUN_LAST: weakref.WeakKeyDictionary[Any, Path] = weakref.WeakKeyDictionary()


def last_checkpoint(ckpt_dir: str | Path) -> Path:
    """The checkpoint a rerun resumes from, in the checkpoint folder ``ckpt_dir``."""
    return Path(ckpt_dir) / f"{LAST}{SUFFIX}"


def run_last_checkpoint(run_folder: str | Path) -> Path:
    """:func:`last_checkpoint` of a run folder that keeps the default ``paths.ckpt_dir``."""
    return last_checkpoint(Path(run_folder) / CHECKPOINTS)


def use_last_checkpoint(trainer: Any, path: str | Path | None) -> None:
    """Make ``path`` (the job's ``paths.last_ckpt``) where every stop and save of ``trainer``'s
    fit writes ``last.ckpt``."""
    if path:
        _RUN_LAST[trainer] = Path(path)


def last_checkpoint_of(trainer: Any) -> Path | None:
    """``trainer``'s ``last.ckpt``: the one the job gave it, else the first ``last_ckpt`` one of
    its callbacks was given in Python (a Trainer the job did not build), else None (no saves)."""
    try:
        given = _RUN_LAST.get(trainer)
    except TypeError:  # a stand-in for a Trainer that takes no weak reference
        given = None
    if given is not None:
        return given
    for callback in getattr(trainer, "callbacks", ()):
        path = getattr(callback, "last_ckpt", None)
        if path:
            return Path(path)
    return None


def refuse_guard_paths(callbacks: Mapping[str, Any] | None) -> None:
    """Raise :class:`ConfigError`, in one line, when a callback of the config (``callbacks.<name>``) sets a
    key laptrain's guards no longer read: every stop writes ``paths.last_ckpt``."""
    found = [
        f"callbacks.{name}.{key}"
        for name, node in (callbacks or {}).items()
        if isinstance(node, Mapping)
        for key in RETIRED_KEYS.get(str(node.get("_target_")), ())
        if key in node
    ]
    if found:
        raise ConfigError(
            f"{', '.join(found)}: delete {'this key' if len(found) == 1 else 'these keys'} from "
            "your config; every stop and save of a run writes paths.last_ckpt (one per run)"
        )
