"""The memory monitor's decisions, without a Trainer: steady growth (a leak) and swap growth."""

from __future__ import annotations

from collections import deque

MB = 1024 * 1024


class GrowthTrend:
    """Least-squares slope of memory over the last ``window_steps`` steps: a leak when it exceeds
    ``min_mb_per_100_steps`` and ``steady_share`` of the readings went up (one jump is not)."""

    def __init__(
        self, window_steps: int = 200, min_mb_per_100_steps: float = 50.0, steady_share: float = 0.7
    ) -> None:
        if window_steps < 2:
            raise ValueError("memory_monitor.leak_window_steps must be >= 2")
        if min_mb_per_100_steps <= 0:
            raise ValueError("memory_monitor.leak_mb_per_100_steps must be > 0")
        self.window_steps = window_steps
        self.min_rate = min_mb_per_100_steps
        self.steady_share = steady_share
        self._points: deque[tuple[int, float]] = deque()

    def update(self, step: int, used_bytes: float) -> float | None:
        """Add a reading; return the growth in MB per 100 steps when it looks like a leak."""
        self._points.append((step, used_bytes / MB))
        while self._points and step - self._points[0][0] > self.window_steps:
            self._points.popleft()
        if len(self._points) < 3 or step - self._points[0][0] < self.window_steps:
            return None
        xs = [p[0] for p in self._points]
        ys = [p[1] for p in self._points]
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mean_x) ** 2 for x in xs)
        if var == 0:
            return None
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var
        ups = sum(b > a for a, b in zip(ys, ys[1:]))
        if slope * 100 >= self.min_rate and ups >= self.steady_share * (len(ys) - 1):
            return slope * 100
        return None


class SwapWatch:
    """Swap used now vs. when training started; "growing" past ``threshold_mb``."""

    def __init__(self, threshold_mb: float = 256.0) -> None:
        if threshold_mb <= 0:
            raise ValueError("memory_monitor.swap_growth_mb must be > 0")
        self.threshold_mb = threshold_mb
        self.start: int | None = None

    def update(self, swap_used: int) -> float | None:
        """Return the growth in MB when it passes the threshold, else None."""
        if self.start is None:
            self.start = swap_used
        grown = (swap_used - self.start) / MB
        return grown if grown >= self.threshold_mb else None
