"""TRM learns Sudoku on CPU (step budgets, not minutes: the shared machine's speed varies).

Reference figures (docs/trm.md §9, throwaway code on 2 cores): tiny on 55-60 givens reached 57%
blank-cell accuracy (raw weights) at 157 steps; on 40-45 givens 92.0% / 96.8% EMA exact at
694 / 783 steps.
"""

from __future__ import annotations

import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml

from laptrain.families.trm import TRMSudokuModule
from laptrain.families.trm.metrics import BLANK_TOKEN
from laptrain.families.trm.sudoku import SudokuDataModule
from tests.conftest import quiet_trainer

SIZES = yaml.safe_load((Path(__file__).parents[1] / "conf/model/trm_sudoku.yaml").read_text())[
    "sizes"
]


class LossRecorder(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(trainer.callback_metrics["train/loss"]))


def train_tiny(
    givens: tuple[int, int], train_size: int, steps: int, ema: bool, tmp_path: Path
) -> tuple[TRMSudokuModule, SudokuDataModule, LossRecorder, float]:
    data = SudokuDataModule(
        board_size=9,
        givens=givens,
        train_size=train_size,
        val_size=16,
        test_size=500,
        batch_size=64,
        steps_per_epoch=steps,
        seed=0,
    )
    data.prepare_data()
    data.setup("fit")
    sizes = {"tiny": {**SIZES["tiny"], "ema_decay": SIZES["tiny"]["ema_decay"] if ema else 0.0}}
    torch.manual_seed(0)
    module = TRMSudokuModule(**data.model_kwargs(), size="tiny", sizes=sizes)
    recorder = LossRecorder()
    trainer = quiet_trainer(
        max_steps=steps,
        limit_val_batches=0,
        callbacks=[recorder],
        default_root_dir=tmp_path,
    )
    start = time.perf_counter()
    trainer.fit(module, data)
    return module, data, recorder, time.perf_counter() - start


def held_out_accuracy(module: TRMSudokuModule, data: SudokuDataModule) -> tuple[float, float]:
    """(exact, blank-cell) accuracy on the test split after all supervision steps."""
    module.eval()
    solved = correct_blanks = blanks = 0
    for batch in data.test_dataloader():
        pred = module.solve(batch["inputs"])["pred"]
        right = pred == batch["labels"]
        blank = batch["inputs"] == BLANK_TOKEN
        solved += int(right.all(-1).sum())
        correct_blanks += int((right & blank).sum())
        blanks += int(blank.sum())
    return solved / len(data.splits["test"]["inputs"]), correct_blanks / blanks


@pytest.mark.slow  # ~90 s on 2 cores; the suite keeps TRM's train.py and resume checks
def test_tiny_learns_easy_sudoku_in_150_steps(tmp_path: Path) -> None:
    module, data, recorder, seconds = train_tiny((55, 60), 1000, 150, ema=False, tmp_path=tmp_path)
    exact, blank = held_out_accuracy(module, data)
    print(f"\n55-60 givens, 150 steps: blank {blank:.1%}, exact {exact:.1%}, fit {seconds:.0f}s")
    assert blank >= 0.40
    assert sum(recorder.losses[-10:]) / 10 < recorder.losses[9]


@pytest.mark.slow
def test_tiny_solves_40_to_45_given_sudoku_with_ema(tmp_path: Path) -> None:
    module, data, _, seconds = train_tiny((40, 45), 6000, 800, ema=True, tmp_path=tmp_path)
    exact, blank = held_out_accuracy(module, data)  # the module holds the EMA weights after fit
    print(
        f"\n40-45 givens, 800 steps: EMA exact {exact:.1%}, blank {blank:.1%}, fit {seconds:.0f}s"
    )
    assert exact >= 0.85
