"""Keep the laptop awake while it trains, and never lose a run to a flat battery."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from laptrain.callbacks.contracts import VersionedState, cooling_s, stop_requested
from laptrain.checkpoints.stop import request_stop
from laptrain.hardware.power import BatteryReading, BatterySource, KeepAwake, PsutilBattery

# below this many timed steps per power state, a step-time comparison is noise
MIN_TIMED_STEPS = 5


class PowerGuard(VersionedState, Callback):
    """Hold off idle sleep during fit; watch the battery; stop or pause before it runs flat.

    No trainer looks at power: macOS idle-sleeps a laptop mid-run, and a battery that dies during a
    save is a SIGKILL. The keep-awake holder lives from ``setup`` to ``teardown``/``on_exception``;
    below ``min_percent`` it saves and stops (exit 75), or with ``pause_on_battery`` waits for the
    charger. docs/hardware.md §16; rank 0's battery decides (docs/callbacks.md)."""

    report_section = "power"
    STATE_VERSION = 1
    STATE_NAME = "power_guard"
    STATE_RESETS = "battery time, pauses and step times"

    def __init__(
        self,
        keep_awake: bool = True,
        battery: BatterySource | None = None,
        use_os_battery: bool = True,
        warn_on_battery: bool = True,
        min_percent: float = 20.0,
        pause_on_battery: bool = False,
        check_every_n_steps: int = 10,
        pause_check_seconds: float = 30.0,
        awake: KeepAwake | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not 0 <= min_percent < 100:
            raise ValueError("power_guard.min_percent must be in [0, 100) (0 = never stop)")
        if check_every_n_steps < 1:
            raise ValueError("power_guard.check_every_n_steps must be >= 1")
        if pause_check_seconds <= 0:
            raise ValueError("power_guard.pause_check_seconds must be > 0")
        self.keep_awake, self.battery = keep_awake, battery
        self.use_os_battery, self.warn_on_battery = use_os_battery, warn_on_battery
        self.min_percent, self.pause_on_battery = min_percent, pause_on_battery
        self.every_n, self.pause_check_seconds = check_every_n_steps, pause_check_seconds
        self.awake, self.clock, self.sleep = awake, clock, sleep
        self.stop_reason: str | None = None
        self.awake_line = "off"
        self.last: BatteryReading | None = None
        self.start_reading: BatteryReading | None = None
        self.lowest_percent: float | None = None
        self.battery_s, self.pauses, self.paused_s = 0.0, 0, 0.0
        self.events: list[dict[str, Any]] = []
        # per power state: [timed steps, seconds], over every session of the run
        self.step_time = {"battery": [0, 0.0], "plugged": [0, 0.0]}
        self._batches, self._t0, self._cooling0 = 0, 0.0, 0.0
        self._last_read = 0.0  # while paused: when this rank last read the battery

    @property
    def cooling_s(self) -> float:
        """Seconds paused on battery: like cooling breaks, not training time."""
        return self.paused_s

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if self.battery is None and self.use_os_battery:
            self.battery = PsutilBattery()
        if self.keep_awake and trainer.is_global_zero:
            self.awake = self.awake or KeepAwake()
            self.awake_line = self.awake.start()
            rank_zero_info(
                f"power: {self.awake_line} (callbacks.power_guard.keep_awake=false turns this off)"
            )

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stop_reason, self._batches = None, 0
        if self.battery is None:
            return
        reading = trainer.strategy.broadcast(self._read(trainer))  # rank 0's, on every rank
        if reading is None:
            rank_zero_info(
                "power: no battery found (a desktop, or the OS does not say): battery checks off"
            )
            self.battery = None
            return
        self.start_reading = reading
        if reading.on_battery and self.warn_on_battery:
            rank_zero_warn(
                f"power: training on battery ({_describe(reading)}); {self.cost_text()}. Plug in for "
                "long runs; callbacks.power_guard.warn_on_battery=false silences this"
            )

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.battery is None:
            return  # nothing is timed (on_train_batch_end returns early too)
        self._t0, self._cooling0 = self.clock(), cooling_s(trainer.callbacks)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.battery is None:
            return
        spent = self.clock() - self._t0 - (cooling_s(trainer.callbacks) - self._cooling0)
        state = "battery" if self.last is not None and self.last.on_battery else "plugged"
        self.step_time[state][0] += 1
        self.step_time[state][1] += spent
        if state == "battery":
            self.battery_s += spent
        self._batches += 1
        if self._batches != 1 and self._batches % self.every_n:
            return
        reading = trainer.strategy.broadcast(self._read(trainer))  # rank 0's, on every rank
        if reading is None:
            return
        if self._too_low(reading):
            self._stop(trainer, reading)
        elif reading.on_battery and self.pause_on_battery:
            self._pause(trainer, reading)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._release()

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._release()

    def _release(self) -> None:
        if self.awake is not None:
            self.awake.stop()

    def _read(self, trainer: pl.Trainer) -> BatteryReading | None:
        reading = self.battery.read() if self.battery is not None else None
        if reading is None:
            return None
        self.last = reading
        if reading.on_battery and (
            self.lowest_percent is None or reading.percent < self.lowest_percent
        ):
            self.lowest_percent = reading.percent
        metrics = {"power/percent": reading.percent}
        if reading.plugged is not None:
            metrics["power/plugged"] = float(reading.plugged)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        return reading

    def _too_low(self, reading: BatteryReading) -> bool:
        return reading.on_battery and reading.percent < self.min_percent

    def _stop(self, trainer: pl.Trainer, reading: BatteryReading) -> None:
        self.stop_reason = "battery"
        self._event(trainer, "stop", f"{reading.percent:.0f} % on battery", 0.0)  # in the save
        # at this batch boundary, moved over last.ckpt at fit end (laptrain/checkpoints/stop.py)
        request_stop(trainer, self.stop_reason)
        rank_zero_warn(
            f"power: battery at {reading.percent:.0f} % (below callbacks.power_guard.min_percent="
            f"{self.min_percent:g}) at step {trainer.global_step}: checkpoint saved, stopping "
            "cleanly. Plug in and rerun the same command to resume"
        )

    def _pause(self, trainer: pl.Trainer, reading: BatteryReading) -> None:
        """Sleep in short slices until the charger is back, the battery is too low, or a stop is asked."""
        rank_zero_info(
            f"power: paused at step {trainer.global_step} on battery ({_describe(reading)}) until the "
            "charger is back (callbacks.power_guard.pause_on_battery=false trains on battery)"
        )
        start = self._last_read = self.clock()
        while True:
            # every rank, every slice: rank 0's clock says when the battery is read again
            verdict, reading = trainer.strategy.broadcast(self._pause_verdict(trainer))
            if verdict == "low":
                self._stop(trainer, reading)
            if verdict != "wait":
                break
            self.sleep(min(1.0, self.pause_check_seconds))
        taken = self.clock() - start
        self.pauses += 1
        self.paused_s += taken
        self._event(trainer, "pause", "on battery", taken)
        for logger in trainer.loggers:
            logger.log_metrics({"power/pause_s": taken}, step=trainer.global_step)
        if not stop_requested(trainer):
            rank_zero_info(
                f"power: charger back after a pause of {taken:.0f} s; training resumes at step "
                f"{trainer.global_step}"
            )

    def _pause_verdict(self, trainer: pl.Trainer) -> tuple[str, BatteryReading | None]:
        """This rank's view of a pause at the end of a slice, with the reading it took (if any):
        "asked" (a stop is asked for: the stopping callback saves and stops at this boundary),
        "resume" (the charger is back, or no reading), "low" (stop) or "wait"."""
        if stop_requested(trainer):
            return "asked", None
        if self.clock() - self._last_read < self.pause_check_seconds:
            return "wait", None
        self._last_read = self.clock()
        reading = self._read(trainer)
        if reading is None or not reading.on_battery:
            return "resume", reading
        return ("low" if self._too_low(reading) else "wait"), reading

    def _event(self, trainer: pl.Trainer, kind: str, reason: str, seconds: float) -> None:
        event = {"step": trainer.global_step, "kind": kind, "reason": reason, "s": seconds}
        self.events = [*self.events[-99:], event]

    def step_s(self, state: str) -> float | None:
        """Mean training seconds per step in ``state`` ("battery" / "plugged"), once measured."""
        steps, seconds = self.step_time[state]
        return seconds / steps if steps >= MIN_TIMED_STEPS else None

    def cost_text(self) -> str:
        """What training on battery cost in this run so far, or why it is not known yet."""
        on_battery, plugged = self.step_s("battery"), self.step_s("plugged")
        if on_battery is None or plugged is None:
            return (
                "its cost is not measured yet: report.json's power section compares step times "
                "on battery and plugged in once this run has trained both ways"
            )
        return (
            f"earlier in this run a step took {on_battery:.3g} s on battery vs {plugged:.3g} s "
            f"plugged in ({100 * (on_battery / plugged - 1):+.0f} %)"
        )

    def plot_point(self) -> dict[str, Any]:
        if self.last is None:
            return {}
        return {"battery_percent": self.last.percent, "plugged": self.last.plugged}

    def summary(self) -> dict[str, Any]:
        """What the run report shows."""
        start = self.start_reading
        return {
            "keep_awake": self.awake_line,
            "battery": getattr(self.battery, "name", None) or "none",
            "start_percent": start.percent if start else None,
            "start_plugged": start.plugged if start else None,
            "last_percent": self.last.percent if self.last else None,
            "lowest_percent_on_battery": self.lowest_percent,
            "train_s_on_battery": self.battery_s,
            "step_s_on_battery": self.step_s("battery"),
            "step_s_plugged": self.step_s("plugged"),
            "pauses": self.pauses,
            "paused_s": self.paused_s,
            "stopped_on_battery": self.stop_reason == "battery",
            "events": self.events,
        }

    def saved_state(self) -> dict[str, Any]:
        return {
            "battery_s": self.battery_s,
            "pauses": self.pauses,
            "paused_s": self.paused_s,
            "events": self.events,
            "lowest_percent": self.lowest_percent,
            "step_time": {k: list(v) for k, v in self.step_time.items()},
        }

    def restore_state(self, state_dict: Mapping[str, Any]) -> None:
        self.battery_s, self.pauses = state_dict["battery_s"], state_dict["pauses"]
        self.paused_s, self.events = state_dict["paused_s"], list(state_dict["events"])
        self.lowest_percent = state_dict["lowest_percent"]
        self.step_time = {k: list(v) for k, v in state_dict["step_time"].items()}


def _describe(reading: BatteryReading) -> str:
    text = f"{reading.percent:.0f} %"
    if reading.seconds_left is not None:
        hours, minutes = divmod(reading.seconds_left // 60, 60)
        text += (
            f", about {hours} h {minutes:02d} min left" if hours else f", about {minutes} min left"
        )
    return text
