"""A spawned fit's outcome in the main process: under ``ddp_spawn`` the callbacks that stop or end
a run act in the spawned ranks, and Lightning sends back to the main process only rank 0's best
checkpoint path, trainer state and ``callback_metrics`` (``_MultiProcessingLauncher``); their
outcome fields ride back the same way, so the run exits as one process would (75, 128 + signal)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher

# callbacks.contracts: StopsRun, StopsOnSignal, EndsEarly; TrialPruning's score
OUTCOME_FIELDS = ("stop_reason", "signal_received", "ended_early", "value")


class _OutcomeLauncher(_MultiProcessingLauncher):
    def get_extra_results(self, trainer: pl.Trainer) -> dict[str, Any]:
        outcomes = [
            {k: getattr(cb, k) for k in OUTCOME_FIELDS if hasattr(cb, k)}
            for cb in trainer.callbacks
        ]
        return {**super().get_extra_results(trainer), "callback_outcomes": outcomes}

    def update_main_process_results(self, trainer: pl.Trainer, extra: dict[str, Any]) -> None:
        super().update_main_process_results(trainer, extra)
        for callback, outcome in zip(trainer.callbacks, extra["callback_outcomes"], strict=False):
            for name, value in outcome.items():
                setattr(callback, name, value)


def carry_outcomes_back(strategy: Any) -> None:
    """Have a spawned fit's callback outcomes (rank 0's) set on the main process's callbacks."""
    if type(getattr(strategy, "launcher", None)) is _MultiProcessingLauncher:
        strategy.launcher.__class__ = _OutcomeLauncher
