"""Sudoku metrics: exact, blank-cell and all-cell accuracy, halt accuracy, steps, thinking curve."""

from __future__ import annotations

import torch
from torch import nn
from torchmetrics.aggregation import MeanMetric

BLANK_TOKEN = 1  # token scheme of the official builder: pad 0, blank 1, digits 2.. (docs/trm.md §4)


class SudokuMetrics(nn.Module):
    """Running means over puzzles; ``exact_acc_step{k}`` is exact accuracy after supervision step k.

    ``cell_acc`` counts every cell, givens included (the official ``accuracy``, for comparison
    only); ``blank_acc`` counts only the cells that were blank in the puzzle.
    """

    NAMES = ("exact_acc", "blank_acc", "cell_acc", "halt_acc", "steps")

    def __init__(self, n_sup: int) -> None:
        super().__init__()
        self.means = nn.ModuleDict({name: MeanMetric() for name in self.NAMES})
        self.thinking = nn.ModuleList(MeanMetric() for _ in range(n_sup))

    def update_step(self, step: int, pred: torch.Tensor, labels: torch.Tensor) -> None:
        self.thinking[step].update((pred == labels).all(-1).float())

    def update(
        self,
        pred: torch.Tensor,
        labels: torch.Tensor,
        inputs: torch.Tensor,
        halt_logit: torch.Tensor,
        steps: torch.Tensor,
    ) -> None:
        if pred.numel() == 0:
            return
        correct = pred == labels
        solved = correct.all(-1)
        blank = inputs == BLANK_TOKEN
        self.means["exact_acc"].update(solved.float())
        self.means["cell_acc"].update(correct.float().mean(-1))
        blanks = blank.sum()
        if blanks > 0:
            value = (correct & blank).sum().float() / blanks
            self.means["blank_acc"].update(value, weight=blanks.float())
        self.means["halt_acc"].update(((halt_logit > 0) == solved).float())
        self.means["steps"].update(steps.float())

    def compute(self) -> dict[str, torch.Tensor]:
        out = {
            name: metric.compute() for name, metric in self.means.items() if metric.update_called
        }
        for k, metric in enumerate(self.thinking, start=1):
            if metric.update_called:
                out[f"exact_acc_step{k:02d}"] = metric.compute()
        return out

    def reset(self) -> None:
        for metric in [*self.means.values(), *self.thinking]:
            metric.reset()
