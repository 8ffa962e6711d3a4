"""TRM at smoke-test size: a 32-wide model on 4x4 Sudoku, with a halt head that fires for some
slots so slots sit at different depths (the carry's reset path runs)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
import yaml

from laptrain.data.sudoku import SudokuDataModule
from laptrain.model.trm import TRMSudokuModule
from laptrain.project import conf_dir


def _sizes() -> dict[str, dict[str, Any]]:
    sizes = yaml.safe_load((conf_dir() / "model" / "trm_sudoku.yaml").read_text())["sizes"]
    return {"tiny": {**sizes["tiny"], "hidden_size": 32, "n_sup": 3, "warmup_steps": 2}}


def build(seed: int, steps: int) -> tuple[pl.LightningModule, pl.LightningDataModule]:
    """A fresh module (weights from ``seed``) and an epoch of ``steps`` batches of 8 boards."""
    data = SudokuDataModule(
        board_size=4,
        givens=(5, 8),
        train_size=32,
        val_size=8,
        test_size=8,
        batch_size=8,
        eval_batch_size=8,
        steps_per_epoch=steps,
        seed=3,
    )
    data.prepare_data()
    torch.manual_seed(seed)
    module = TRMSudokuModule(**data.model_kwargs(), size="tiny", sizes=_sizes())
    with torch.no_grad():
        module.model.halt_head.bias.fill_(0.0)
        module.model.halt_head.weight.normal_(0.0, 1.0)
    return module, data


def predict(module: pl.LightningModule, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The solved board of each puzzle."""
    return module.solve(batch["inputs"])["pred"]
