"""TRM at smoke-test size: the ``trm_sudoku`` preset (size tiny, its loss, halting, exploration,
betas, EMA, compile and checkpointing choices) shrunk to 32 wide and 3 supervision steps, on 4x4
Sudoku, with a halt head that fires for some slots so slots sit at different depths (the carry's
reset path runs)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from laptrain.families.smoke_data import build_preset, preset_config
from laptrain.families.trm.sudoku import SudokuDataModule

PRESET = "trm_sudoku"
SIZE = "tiny"
# Smoke size; every other key of the preset and of its size stays.
SHRUNK = {"hidden_size": 32, "n_sup": 3, "warmup_steps": 2}
# The preset's interpolations (the run's seed, hardware.memory_budget_gb) have no run here.
OVERRIDES: dict[str, Any] = {
    "size": SIZE,
    "sizes": {SIZE: SHRUNK},
    "memory_gb": None,
    "seed": 0,
}

_BOARDS: dict[str, Any] = {}


def build(
    seed: int, steps: int, kind: str = "cpu", precision: str = "32-true"
) -> tuple[pl.LightningModule, pl.LightningDataModule]:
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
    key = data.cache_key()
    if key in _BOARDS:  # the same boards every build: generate them once per process
        data.splits = {split: dict(arrays) for split, arrays in _BOARDS[key].items()}
    data.prepare_data()
    _BOARDS.setdefault(key, data.splits)
    torch.manual_seed(seed)
    module = build_preset(PRESET, OVERRIDES, kind, precision, **data.model_kwargs())
    with torch.no_grad():
        module.model.halt_head.bias.fill_(0.0)
        module.model.halt_head.weight.normal_(0.0, 1.0)
    return module, data


def predict(module: pl.LightningModule, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The solved board of each puzzle."""
    return module.solve(batch["inputs"])["pred"]


def note(kind: str) -> str:
    """What the cells run, for the table's legend."""
    cfg = preset_config(PRESET, OVERRIDES)
    size = cfg["sizes"][SIZE]
    return (
        f"{PRESET} preset, size {SIZE}: loss {cfg['loss']}, halting "
        f"{'on' if cfg['halting'] else 'off'}, exploration {cfg['exploration_prob']}, EMA "
        f"{size['ema_decay']}, compile {'on' if cfg['compile'] else 'off'}, gradient "
        f"checkpointing {'on' if cfg['grad_checkpoint'] else 'off'}; {size['mixer']} mixer "
        f"{size['layers']} x {size['hidden_size']}, n_sup {size['n_sup']}, 4x4 boards, batch 8"
    )
