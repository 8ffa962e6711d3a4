"""The thermal guard's arithmetic, without a Trainer: ``ThroughputDrift`` compares a recent window's
median step time with the run's early baseline (on every OS); ``CoolingBudget`` caps breaks per
rolling hour, so a machine slow for another reason is not paused forever."""

from __future__ import annotations

from collections import deque
from statistics import median
from typing import Any


class ThroughputDrift:
    """Median step time of the last ``window`` steps vs. the median of the first ``baseline`` ones
    after ``warmup`` (allocator warm-up, kernel compilation)."""

    def __init__(self, warmup: int = 5, baseline: int = 20, window: int = 20) -> None:
        if warmup < 0 or baseline < 1 or window < 1:
            raise ValueError(
                "thermal_guard: warmup_steps >= 0, baseline_steps and window_steps >= 1"
            )
        self.warmup, self.baseline_size, self.window_size = warmup, baseline, window
        self.seen = 0
        self._early: list[float] = []
        self.baseline_s: float | None = None
        self._window: deque[float] = deque(maxlen=window)

    def update(self, step_seconds: float) -> None:
        self.seen += 1
        if self.seen <= self.warmup:
            return
        if self.baseline_s is None:
            self._early.append(step_seconds)
            if len(self._early) == self.baseline_size:
                self.baseline_s = median(self._early)
                self._early = []
            return
        self._window.append(step_seconds)

    def drift_pct(self) -> float | None:
        """How much slower the window is than the baseline, in percent (None until both are full)."""
        if self.baseline_s is None or len(self._window) < self.window_size:
            return None
        if self.baseline_s <= 0:
            return 0.0
        return 100.0 * (median(self._window) / self.baseline_s - 1.0)

    def restart_window(self) -> None:
        """Forget the window (after a break, so the next verdict is about post-break steps)."""
        self._window.clear()

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen, "baseline_s": self.baseline_s, "early": list(self._early)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = state["seen"]
        self.baseline_s = state["baseline_s"]
        self._early = list(state["early"])
        self._window.clear()


class CoolingBudget:
    """Break lengths under a cap of ``max_seconds_per_hour`` within any rolling hour."""

    def __init__(self, break_seconds: float, max_seconds_per_hour: float) -> None:
        if break_seconds <= 0:
            raise ValueError("thermal_guard.break_seconds must be > 0")
        if max_seconds_per_hour < 0:
            raise ValueError("thermal_guard.max_break_seconds_per_hour must be >= 0")
        self.break_seconds = break_seconds
        self.max_per_hour = max_seconds_per_hour
        self._taken: list[tuple[float, float]] = []

    def allowed(self, now: float) -> float:
        """Length of a break that may start at ``now`` (0 when this hour's budget is spent)."""
        self._taken = [(t, s) for t, s in self._taken if now - t < 3600.0]
        used = sum(s for _, s in self._taken)
        return max(0.0, min(self.break_seconds, self.max_per_hour - used))

    def record(self, start: float, seconds: float) -> None:
        self._taken.append((start, seconds))
