"""Test-only callback for runs through submitit's local executor: hold training at a chosen step
until the executor's own time-limit signal has arrived, so the stop lands at that step."""

from __future__ import annotations

import time
from typing import Any

from lightning.pytorch import Callback


class WaitForSignalAt(Callback):
    """At the start of the batch that makes optimizer step ``step``, sleep until a callback has
    recorded a stop signal (``signal_received``), at most ``max_wait_s``. The executor sends its
    signal ``signal_delay_s`` before its time limit, counted from the job's start; the run is then
    at this step wherever the clock is, and the resumed run (past the step) never waits."""

    def __init__(self, step: int, max_wait_s: float = 120.0) -> None:
        self.step, self.max_wait_s = step, max_wait_s

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step + 1 != self.step:
            return
        end = time.monotonic() + self.max_wait_s
        while time.monotonic() < end:
            if any(getattr(cb, "signal_received", None) for cb in trainer.callbacks):
                return
            time.sleep(0.05)
