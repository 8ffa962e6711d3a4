"""Tiny Recursive Model (arXiv:2510.04871): network, deep supervision with ACT, Sudoku module."""

from laptrain.model.trm.module import TRMSudokuModule
from laptrain.model.trm.network import TinyRecursiveModel, TRMArch

__all__ = ["TRMArch", "TRMSudokuModule", "TinyRecursiveModel"]
