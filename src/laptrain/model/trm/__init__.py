"""Tiny Recursive Model (arXiv:2510.04871): network, deep supervision with ACT, Sudoku module.

Names load lazily, so ``python -m laptrain.model.trm.sizing`` (the ``size=auto`` dry run) does not
import torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "TRMSudokuModule": "laptrain.model.trm.module",
    "TinyRecursiveModel": "laptrain.model.trm.network",
    "TRMArch": "laptrain.model.trm.network",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
