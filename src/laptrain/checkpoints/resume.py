"""Which checkpoint a run resumes from (``ckpt_path``, else ``last.ckpt`` unless ``resume=false``),
opened the safe way and its weights compared with the model's before any training, so a truncated
or foreign file is a one-line error; temporary files of interrupted saves are removed first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from laptrain.checkpoints.checkpoint_io import checkpoint_step, clean_leftovers, read_checkpoint
from laptrain.checkpoints.trusted import TrustedGlobals


def resume_checkpoint(ckpt_path: str | None, resume: bool, last: str | Path) -> str | None:
    """``ckpt_path``, else ``last`` when ``resume`` is on and it exists."""
    if ckpt_path:
        path = Path(str(ckpt_path)).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"ckpt_path not found: {path} (point ckpt_path= at a .ckpt file, e.g. outputs/<run>/checkpoints/last.ckpt)"
            )
        return str(path)
    return written_last(last) if resume else None


def written_last(last: str | Path) -> str | None:
    return str(last) if Path(last).is_file() else None


def checked_resume_checkpoint(
    ckpt_path: str | None,
    resume: bool,
    ckpt_dir: str | Path,
    last: str | Path,
    model: Any,
    trusted: TrustedGlobals | None = None,
) -> str | None:
    """:func:`resume_checkpoint`, refused in one line before any training when it is unreadable,
    holds an object the config does not build (``trusted``) or another model's weights; temporary
    files of saves a kill interrupted in ``ckpt_dir`` are removed."""
    clean_leftovers(ckpt_dir)
    path = resume_checkpoint(ckpt_path, resume, last)
    if path:
        option = "ckpt_path" if ckpt_path else "this run's last checkpoint"
        check_resume_checkpoint(path, model, option, trusted)
    return path


def resuming_line(path: str, trusted: TrustedGlobals | None = None) -> str:
    step, epoch = checkpoint_step(path, trusted)
    return (
        f"resuming from {path} (global step {step}, epoch {epoch}); resume=false starts a new run"
    )


def final_step(global_step: int, last: str | Path, trusted: TrustedGlobals | None = None) -> int:
    """The fit's last optimizer step; after a ``ddp_spawn`` fit the main process's Trainer still
    says 0 (``global_step``), so it is read from ``last``."""
    if global_step or written_last(last) is None:
        return global_step
    return checkpoint_step(last, trusted)[0]


def check_resume_checkpoint(
    path: str | Path, model: torch.nn.Module, option: str, trusted: TrustedGlobals | None = None
) -> None:
    """Refuse, in one line, a checkpoint whose weights do not fit ``model``: the keys and shapes
    of its ``state_dict`` must be the model's. ``option`` names how the file was chosen."""
    saved = read_checkpoint(path, trusted)["state_dict"]
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    # A module with strict_loading=False (LoRA: adapters only) saves a subset of its weights.
    strict = bool(getattr(model, "strict_loading", True))
    missing = [k for k in expected if k not in saved] if strict else []
    unexpected = [k for k in saved if k not in expected]
    reshaped = [k for k in expected if k in saved and tuple(saved[k].shape) != expected[k]]
    if not (missing or unexpected or reshaped):
        return
    parts = []
    if reshaped:
        k = reshaped[0]
        parts.append(
            f"{len(reshaped)} weights have other shapes (e.g. {k}: {tuple(saved[k].shape)} "
            f"in the file, {expected[k]} in this model)"
        )
    if missing:
        parts.append(f"{len(missing)} of this model's weights are missing (e.g. {missing[0]})")
    if unexpected:
        parts.append(f"{len(unexpected)} are not this model's (e.g. {unexpected[0]})")
    raise ValueError(
        f"{path} ({option}) was written by another model: {'; '.join(parts)}. "
        "Use resume=false (or another run_name) to start this model in a new folder, or point "
        "ckpt_path= at a checkpoint of this model"
    )
