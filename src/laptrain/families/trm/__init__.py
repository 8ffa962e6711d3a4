"""Tiny Recursive Model (arXiv:2510.04871): network, deep supervision with ACT, the Sudoku module,
its Sudoku data (``sudoku``, ``sudoku_extreme``, ``sudoku_generator``), its EMA callback
(``ema``), sizing and smoke build.

Names load lazily, so ``python -m laptrain.families.trm.sizing`` (the ``size=auto`` dry run) does
not import torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from laptrain.family import Family

_EXPORTS = {
    "TRMSudokuModule": "laptrain.families.trm.module",
    "TinyRecursiveModel": "laptrain.families.trm.network",
    "TRMArch": "laptrain.families.trm.network",
}
__all__ = sorted([*_EXPORTS, "FAMILY"])


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)


def _refuse_precision(kind: str, precision: str) -> str | None:
    from laptrain.families.trm.module import refuse_precision

    return refuse_precision(kind, precision)


def _smoke() -> Any:
    from laptrain.families.trm import smoke

    return smoke


FAMILY = Family(
    name="trm",
    summary="the Tiny Recursive Model on Sudoku (deep supervision, ACT halting, EMA)",
    refuse_precision=_refuse_precision,
    # measured on 2 gloo CPU ranks: "Expects BACKWARD_PRE or BACKWARD_POST state but got
    # HandleTrainingState.FORWARD" at step 1 (FSDP's post-backward hook)
    fsdp_refusal=(
        "its step back-propagates inside the forward (manual optimization, deep "
        "supervision), which FSDP's root unit does not allow, and its EMA keeps whole "
        "weights; its largest preset has 5 M parameters: use trainer=ddp"
    ),
    manual_optimization=True,
    smoke=_smoke,
)
