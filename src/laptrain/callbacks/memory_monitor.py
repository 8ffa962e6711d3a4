"""Device and host memory over a run, with cleanups, a swap alarm and a leak warning."""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from laptrain.callbacks.contracts import VersionedState
from laptrain.callbacks.memory_trend import MB, GrowthTrend, SwapWatch
from laptrain.checkpoints.stop import request_stop
from laptrain.hardware.power import (
    PRESSURE_COLOURS,
    PRESSURE_CRITICAL,
    PRESSURE_WARNING,
    PressureSource,
    ProcessMemory,
    pressure_name,
    pressure_source,
    top_processes,
)
from laptrain.hardware.probe import DeviceProbe, MemoryReading, probe_for

SWAP_HINT = (
    "lower hardware.batch_size or the sequence length (data.max_length), or cap MPS memory with "
    "PYTORCH_MPS_HIGH_WATERMARK_RATIO in the profile's env"
)


class MemoryMonitor(VersionedState, Callback):
    """Log MPS/CUDA allocator figures, RSS, system memory and swap under ``memory/``.

    Lightning's ``DeviceStatsMonitor`` on MPS reports only psutil percentages. The allocator cache
    is emptied at epoch end and under pressure only: every log would slow the next steps
    (docs/hardware.md §7). A job that does not fit unified memory swaps instead of failing (§1),
    so swap growth and macOS memory pressure (§16) warn or stop (exit 75). Rank 0's readings
    decide (docs/callbacks.md)."""

    report_section = "memory"
    STATE_VERSION = 1
    STATE_NAME = "memory_monitor"
    STATE_RESETS = "peaks and cleanup counts"

    def __init__(
        self,
        every_n_steps: int | None = None,
        cleanup_on_epoch_end: bool = True,
        cleanup_above_percent: float | None = 85.0,
        cleanup_cooldown_steps: int = 100,
        on_swap: str = "warn",
        swap_growth_mb: float = 256.0,
        leak_window_steps: int = 200,
        leak_mb_per_100_steps: float = 50.0,
        probe: DeviceProbe | None = None,
        on_pressure: str = "warn",
        pressure: PressureSource | None = None,
        use_os_pressure: bool = True,
        top_consumers: Callable[[], list[ProcessMemory]] | None = None,
    ) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(
                "memory_monitor.every_n_steps must be >= 1 (or null for log_every_n_steps)"
            )
        if cleanup_above_percent is not None and not 0 < cleanup_above_percent <= 100:
            raise ValueError("memory_monitor.cleanup_above_percent must be in (0, 100], or null")
        for key, value in (("on_swap", on_swap), ("on_pressure", on_pressure)):
            if value not in ("warn", "stop"):
                raise ValueError(f"memory_monitor.{key} must be 'warn' or 'stop', got {value!r}")
        self.every_n, self.probe = every_n_steps, probe
        self.cleanup_on_epoch_end, self.cleanup_above = cleanup_on_epoch_end, cleanup_above_percent
        self.cooldown, self.on_swap = cleanup_cooldown_steps, on_swap
        self.swap = SwapWatch(swap_growth_mb)
        self.trend = GrowthTrend(leak_window_steps, leak_mb_per_100_steps)
        self.stop_reason: str | None = None
        self.last: dict[str, float] = {}
        self.peaks: dict[str, float] = {}
        self.cleanups, self.freed_mb = 0, 0.0
        self.leak_mb_per_100_steps: float | None = None
        self._last_step, self._last_cleanup_step = -1, -(10**9)
        self._warned_swap = False
        self.on_pressure, self.pressure = on_pressure, pressure
        self.use_os_pressure = use_os_pressure
        self.top_consumers = top_consumers or top_processes
        self.worst_pressure: int | None = None
        self._named_consumers, self._warned_critical = False, False

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.probe is None:
            self.probe = probe_for(trainer.strategy.root_device)
        if self.use_os_pressure and self.pressure is None:
            self.pressure = pressure_source()

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        step = trainer.global_step
        every_n = self.every_n or trainer.log_every_n_steps
        if step == self._last_step or step % every_n:
            return
        self._last_step = step
        reading = self.probe.memory()
        metrics = self.metrics(reading)
        self._track(reading)
        pressure = self.cleanup_above is not None and reading.system_percent >= self.cleanup_above
        if pressure and step - self._last_cleanup_step >= self.cooldown:
            self._last_cleanup_step = step
            metrics["memory/cleanup_freed_mb"] = self.cleanup(
                f"system memory at {reading.system_percent:.0f}%"
            )
        local = (self._swap_growth(reading), self._pressure_level())
        grown, level = trainer.strategy.broadcast(local)  # every rank, every check point
        self._check_swap(trainer, grown)
        self._check_pressure(trainer, metrics, level)
        rate = self.trend.update(step, reading.device_allocated or reading.rss)
        if rate is not None and self.leak_mb_per_100_steps is None:
            self.leak_mb_per_100_steps = rate
            rank_zero_warn(
                f"memory: grew steadily by {rate:.0f} MB per 100 steps over the last "
                f"{self.trend.window_steps} steps; look for tensors kept across steps "
                "(a loss stored without .item() or .detach(), a growing cache in the model)"
            )
        self.last = metrics
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.cleanup_on_epoch_end:
            freed = self.cleanup("epoch end", announce=False)
            for logger in trainer.loggers:
                logger.log_metrics({"memory/cleanup_freed_mb": freed}, step=trainer.global_step)

    def metrics(self, r: MemoryReading) -> dict[str, float]:
        """The scalars of one reading, named by device kind."""
        out = {
            "memory/rss_mb": r.rss / MB,
            "memory/system_percent": float(r.system_percent),
            "memory/swap_used_mb": r.swap_used / MB,
        }
        kind = self.probe.kind
        if kind == "mps" and r.device_allocated is not None:
            out["memory/mps_allocated_mb"] = r.device_allocated / MB
            out["memory/mps_driver_mb"] = (r.device_reserved or 0) / MB
            if r.device_limit:
                out["memory/mps_recommended_pct"] = (
                    100.0 * (r.device_reserved or 0) / r.device_limit
                )
        elif kind == "cuda" and r.device_allocated is not None:
            out["memory/cuda_allocated_mb"] = r.device_allocated / MB
            out["memory/cuda_reserved_mb"] = (r.device_reserved or 0) / MB
            out["memory/cuda_peak_mb"] = (r.device_peak or 0) / MB
        return out

    def cleanup(self, reason: str, announce: bool = True) -> float:
        """gc + empty_cache; return the MB freed (device cache when there is one, else RSS)."""
        before = self.probe.memory()
        gc.collect()
        self.probe.empty_cache()
        after = self.probe.memory()
        if before.device_reserved is not None and after.device_reserved is not None:
            freed = (before.device_reserved - after.device_reserved) / MB
        else:
            freed = (before.rss - after.rss) / MB
        freed = max(freed, 0.0)  # RSS can grow meanwhile; "freed" is never negative
        self.cleanups += 1
        self.freed_mb += freed
        if announce:
            rank_zero_info(f"memory: cleanup ({reason}) freed {freed:.0f} MB")
        return freed

    def _track(self, r: MemoryReading) -> None:
        for key, value in (
            ("rss_mb", r.rss / MB),
            ("system_percent", r.system_percent),
            (
                "device_allocated_mb",
                None if r.device_allocated is None else r.device_allocated / MB,
            ),
            ("device_reserved_mb", None if r.device_reserved is None else r.device_reserved / MB),
            ("device_peak_mb", None if r.device_peak is None else r.device_peak / MB),
            ("swap_used_mb", r.swap_used / MB),
        ):
            if value is not None:
                self.peaks[key] = max(self.peaks.get(key, value), value)

    def _swap_growth(self, r: MemoryReading) -> float | None:
        """This rank's swap growth once past the threshold (None below it); keeps the peak."""
        grown = self.swap.update(r.swap_used)
        session_growth = (r.swap_used - (self.swap.start or 0)) / MB
        self.peaks["swap_grew_mb"] = max(self.peaks.get("swap_grew_mb", 0.0), session_growth)
        return grown

    def _pressure_level(self) -> int | None:
        return self.pressure.read() if self.pressure is not None else None

    def _check_swap(self, trainer: pl.Trainer, grown: float | None) -> None:
        """Warn or stop on ``grown``, rank 0's swap growth: the same call on every rank."""
        if grown is None or self._warned_swap:
            return
        self._warned_swap = True
        stop = self.on_swap == "stop"
        action = (
            "stopping with a checkpoint (memory_monitor.on_swap=stop)" if stop else "continuing"
        )
        rank_zero_warn(
            f"memory: swap grew by {grown:.0f} MB during training, {action}; {SWAP_HINT}"
        )
        if stop:
            self.stop_reason = "swap"
            request_stop(trainer, self.stop_reason)

    def _check_pressure(
        self, trainer: pl.Trainer, metrics: dict[str, float], level: int | None
    ) -> None:
        """Log, name the top consumers or stop on ``level``, rank 0's pressure level."""
        if level is None:
            return
        metrics["memory/pressure_level"] = float(level)
        self.worst_pressure = max(level, self.worst_pressure or 0)
        name = f"{pressure_name(level)} ({PRESSURE_COLOURS.get(level, '?')} in Activity Monitor)"
        if level >= PRESSURE_WARNING and not self._named_consumers:
            self._named_consumers = True
            top = "; ".join(p.text() for p in self.top_consumers()) or "none readable"
            rank_zero_warn(
                f"memory: macOS memory pressure is {name}. The other processes holding the most "
                f"memory: {top}. Close what you can spare, or {SWAP_HINT}"
            )
        if level < PRESSURE_CRITICAL or self._warned_critical:
            return
        self._warned_critical = True
        stop = self.on_pressure == "stop"
        action = (
            "stopping with a checkpoint (memory_monitor.on_pressure=stop)" if stop else "continuing"
        )
        rank_zero_warn(f"memory: macOS memory pressure is {name}, {action}; {SWAP_HINT}")
        if stop:
            self.stop_reason = "memory pressure"
            request_stop(trainer, self.stop_reason)

    def plot_point(self) -> dict[str, Any]:
        """Process RSS and device memory of the last reading, for the report's plot."""
        if not self.last:
            return {}
        return {
            "rss_mb": self.last.get("memory/rss_mb"),
            "device_mb": self.last.get(
                "memory/mps_allocated_mb", self.last.get("memory/cuda_allocated_mb")
            ),
        }

    def summary(self) -> dict[str, Any]:
        """What the run report shows."""
        peaks = {f"peak_{k}": v for k, v in self.peaks.items() if k != "swap_grew_mb"}
        out = {
            "kind": getattr(self.probe, "kind", None),
            **peaks,
            "swap_grew_mb": self.peaks.get("swap_grew_mb", 0.0),
            "swap_warning": self._warned_swap,
            "cleanups": self.cleanups,
            "cleanup_freed_mb": self.freed_mb,
            "leak_warning": self.leak_mb_per_100_steps is not None,
        }
        if self.leak_mb_per_100_steps is not None:
            out["leak_mb_per_100_steps"] = self.leak_mb_per_100_steps
        if self.pressure is not None:
            out["pressure_source"] = self.pressure.name
            out["worst_pressure"] = pressure_name(self.worst_pressure)
        return out

    def saved_state(self) -> dict[str, Any]:
        return {
            "peaks": dict(self.peaks),
            "cleanups": self.cleanups,
            "freed_mb": self.freed_mb,
        }

    def reset_state(self) -> None:
        self.peaks, self.cleanups, self.freed_mb = {}, 0, 0.0

    def restore_state(self, state_dict: Mapping[str, Any]) -> None:
        self.peaks = dict(state_dict["peaks"])
        self.cleanups, self.freed_mb = state_dict["cleanups"], state_dict["freed_mb"]
