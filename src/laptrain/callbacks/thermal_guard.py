"""Cooling breaks when the laptop throttles."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from laptrain.callbacks.contracts import SplitsMicroBatch, VersionedState, stop_requested
from laptrain.callbacks.throughput_drift import CoolingBudget, ThroughputDrift
from laptrain.hardware.probe import DeviceProbe, probe_for
from laptrain.hardware.thermal import LEVEL_NAMES, ThermalSource, thermal_source


class ThermalGuard(VersionedState, Callback):
    """Pause training between steps while the machine is hot.

    Lightning has no thermal awareness: a fanless MacBook Air throttles and the run just slows.
    The OS thermal state and the step-time drift decide a break between two steps (timing only);
    rank 0's verdict decides every rank's (docs/callbacks.md)."""

    report_section = "thermal"
    STATE_VERSION = 1
    STATE_NAME = "thermal_guard"
    STATE_RESETS = "cooling breaks, worst state and the step-time baseline"

    def __init__(
        self,
        source: ThermalSource | None = None,
        use_os_source: bool = True,
        hot_level: int = 2,
        drift_threshold_pct: float | None = 25.0,
        warmup_steps: int = 5,
        baseline_steps: int = 20,
        window_steps: int = 20,
        break_seconds: float = 30.0,
        max_break_seconds_per_hour: float = 300.0,
        check_every_n_steps: int = 10,
        hot_micro_batch_divisor: int = 1,
        probe: DeviceProbe | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if hot_level not in (1, 2, 3):
            raise ValueError(
                "thermal_guard.hot_level must be 1 (fair), 2 (serious) or 3 (critical)"
            )
        if drift_threshold_pct is not None and drift_threshold_pct <= 0:
            raise ValueError(
                "thermal_guard.drift_threshold_pct must be > 0, or null to ignore drift"
            )
        if check_every_n_steps < 1:
            raise ValueError("thermal_guard.check_every_n_steps must be >= 1")
        self.source, self.probe = source, probe
        self.use_os_source = use_os_source
        self.hot_level, self.drift_threshold_pct = hot_level, drift_threshold_pct
        if hot_micro_batch_divisor < 1:
            raise ValueError("thermal_guard.hot_micro_batch_divisor must be >= 1 (1 = off)")
        self.every_n = check_every_n_steps
        self.hot_micro_batch_divisor = hot_micro_batch_divisor
        self.drift = ThroughputDrift(warmup_steps, baseline_steps, window_steps)
        self.budget = CoolingBudget(break_seconds, max_break_seconds_per_hour)
        self.clock, self.sleep = clock, sleep
        self.breaks, self.cooling_s, self.events = 0, 0.0, []
        self.worst_level: int | None = None
        self.last_level: int | None = None
        self.last_drift_pct: float | None = None
        self.max_drift_pct: float | None = None
        self._batches, self._t0, self._warned_cap = 0, 0.0, False

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.probe is None:
            self.probe = probe_for(trainer.strategy.root_device)
        if self.use_os_source and self.source is None:
            self.source = thermal_source()
            name = self.source.name if self.source else "none (step-time drift only)"
            rank_zero_info(f"thermal: source {name}")

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self._t0 = self.clock()

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.probe.synchronize()  # on MPS/CUDA the clock would otherwise time the enqueue only
        self.drift.update(self.clock() - self._t0)
        self._batches += 1
        if self._batches % self.every_n:
            return
        reading = self.source.read() if self.source else None
        drift = self.drift.drift_pct()
        metrics: dict[str, float] = {}
        if reading is not None:
            self.last_level = reading.level
            self.worst_level = max(reading.level, self.worst_level or 0)
            metrics["thermal/state"] = float(reading.level)
            if reading.celsius is not None:
                metrics["thermal/celsius"] = reading.celsius
        if drift is not None:
            self.last_drift_pct = drift
            self.max_drift_pct = max(drift, self.max_drift_pct or drift)
            metrics["thermal/drift_pct"] = drift
        reason = self._reason(reading.level if reading else None, drift)
        allowed = self.budget.allowed(self.clock()) if reason else 0.0
        reason, seconds = trainer.strategy.broadcast((reason, allowed))  # rank 0's, every rank
        self._split_while_hot(trainer, hot=reason is not None)
        if reason and seconds > 0:
            metrics["thermal/cooling_break_s"] = self._cool(trainer, reason, seconds)
        elif reason and not self._warned_cap:
            self._warned_cap = True
            rank_zero_warn(
                f"thermal: hot ({reason}) but this hour's cooling budget is spent; raise "
                "thermal_guard.max_break_seconds_per_hour or let the machine cool between runs"
            )
        for logger in trainer.loggers if metrics else ():
            logger.log_metrics(metrics, step=trainer.global_step)

    def _split_while_hot(self, trainer: pl.Trainer, hot: bool) -> None:
        if self.hot_micro_batch_divisor <= 1:
            return
        divisor = self.hot_micro_batch_divisor if hot else 1
        for cb in trainer.callbacks:
            if isinstance(cb, SplitsMicroBatch) and cb.chunk_divisor != divisor:
                cb.set_chunk_divisor(divisor)
                rank_zero_info(f"thermal: micro-batch divided by {divisor} (effective batch kept)")

    def _reason(self, level: int | None, drift: float | None) -> str | None:
        if level is not None and level >= self.hot_level:
            return f"thermal state {LEVEL_NAMES[min(level, 3)]}"
        if drift is not None and self.drift_threshold_pct and drift > self.drift_threshold_pct:
            return f"step time {drift:.0f}% over the run's baseline"
        return None

    def _cool(self, trainer: pl.Trainer, reason: str, seconds: float) -> float:
        """Sleep in short slices, so that Ctrl-C or SIGTERM ends the break at this batch boundary."""
        start = self.clock()
        while (left := seconds - (self.clock() - start)) > 0:
            if stop_requested(trainer):  # the stopping callback saves and stops at this boundary
                break
            self.sleep(min(1.0, left))
        taken = self.clock() - start
        if taken <= 0:
            return 0.0
        self.budget.record(start, taken)
        self.breaks += 1
        self.cooling_s += taken
        self.events = [
            *self.events[-99:],
            {"step": trainer.global_step, "reason": reason, "s": taken},
        ]
        self.drift.restart_window()
        rank_zero_info(
            f"thermal: cooling break of {taken:.0f} s at step {trainer.global_step} ({reason})"
        )
        return taken

    def plot_point(self) -> dict[str, Any]:
        return {"thermal_state": self.last_level, "drift_pct": self.last_drift_pct}

    def summary(self) -> dict[str, Any]:
        """What the run report shows."""
        source = getattr(self.source, "name", None) or "none (step-time drift only)"
        worst = LEVEL_NAMES[self.worst_level] if self.worst_level is not None else None
        return {
            "source": source,
            "worst_state": worst,
            "baseline_step_s": self.drift.baseline_s,
            "max_drift_pct": self.max_drift_pct,
            "cooling_breaks": self.breaks,
            "cooling_s": self.cooling_s,
            "events": self.events,
        }

    def saved_state(self) -> dict[str, Any]:
        return {
            "breaks": self.breaks,
            "cooling_s": self.cooling_s,
            "events": self.events,
            "worst_level": self.worst_level,
            "max_drift_pct": self.max_drift_pct,
            "drift": self.drift.state_dict(),
        }

    def reset_state(self) -> None:
        self.breaks, self.cooling_s, self.events = 0, 0.0, []
        self.worst_level, self.max_drift_pct = None, None
        self.drift = ThroughputDrift(
            self.drift.warmup, self.drift.baseline_size, self.drift.window_size
        )

    def restore_state(self, state_dict: Mapping[str, Any]) -> None:
        self.breaks, self.cooling_s = state_dict["breaks"], state_dict["cooling_s"]
        self.events = list(state_dict["events"])
        self.worst_level, self.max_drift_pct = (
            state_dict["worst_level"],
            state_dict["max_drift_pct"],
        )
        self.drift.load_state_dict(state_dict["drift"])
