"""One report per run, covering all its sessions: what ran where, how fast, and what the guards did."""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor
from typing_extensions import override

from laptrain.callbacks.contracts import (
    PlotsPoints,
    VersionedState,
    cooling_s,
    ended_early,
    report_sections,
    signal_stop,
    stop_reason,
)
from laptrain.callbacks.report_writer import machine_facts, token_count, write_report
from laptrain.checkpoints.last import run_last_checkpoint
from laptrain.console import best_checkpoint
from laptrain.data.collate import batch_length
from laptrain.hardware.peak_rss import process_peak_bytes
from laptrain.loggers.tracking import log_text
from laptrain.run_folder.listing import resume_command
from laptrain.versions import package_versions

GUARD_SECTIONS = ("memory", "thermal", "oom", "power")


class RunReport(VersionedState, Callback):
    """Write ``report.json``, ``report.md`` and ``report.png`` in the run folder.

    Lightning leaves a run's story spread over logger files; this gathers it (with the sections of
    callbacks that have ``summary()``) at every end of a session, its totals kept in the checkpoint
    so a resumed run's report covers every session."""

    STATE_VERSION = 1
    STATE_NAME = "run_report"
    STATE_RESETS = (
        "the earlier sessions' totals and plot history (this report covers this session only)"
    )

    def __init__(
        self,
        output_dir: str | None = None,
        profile: str | None = None,
        every_n_steps: int | None = None,
        max_points: int = 2000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(
                "run_report.every_n_steps must be >= 1 (or null for log_every_n_steps)"
            )
        if max_points < 10:
            raise ValueError("run_report.max_points must be >= 10")
        self.output_dir, self.profile, self.every_n = output_dir, profile, every_n_steps
        self.max_points, self.clock = max_points, clock
        self._reset_totals()
        self.status = "running"
        self._session_start = self._t0 = self.clock()
        self._cooling0 = 0.0
        self._last_step = -1
        self._point = {"t": self._session_start, "samples": 0}
        self._report: dict[str, Any] | None = None
        self.path: Path | None = None  # report.json, once written
        self._batch: dict[str, int] | None = None
        self._epoch = 0
        self._trainer: pl.Trainer | None = None
        self._breaks: list[Any] = []  # the callbacks that take breaks (cooling_s), found in setup

    def _reset_totals(self) -> None:
        """What the checkpoint carries over sessions, as at the start of a new run."""
        self.totals = {"wall_s": 0.0, "train_s": 0.0, "samples": 0, "tokens": 0, "sessions": 0}
        self.history: list[dict[str, Any]] = []
        self.val_history: list[dict[str, Any]] = []  # the validation metrics at each validation
        self.started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._wall_before = 0.0
        self._epoch = 0

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer  # state_dict() needs it for a batch in flight
        if stage == "fit":
            self._session_start = self._point["t"] = self.clock()
            self._breaks = [cb for cb in trainer.callbacks if hasattr(cb, "cooling_s")]

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.totals["sessions"] += 1  # after a resume's load_state_dict

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._t0, self._cooling0 = self.clock(), cooling_s(self._breaks)
        tokens = token_count(batch)  # a tensor on the device: no sync here (report_writer)
        self._batch = {"samples": batch_length(batch), "tokens": 0 if tokens is None else tokens}

    def _batch_totals(self, trainer: pl.Trainer) -> dict[str, Any]:
        """Totals with the current batch counted (it is done once its end hooks run)."""
        if self._batch is None:
            return dict(self.totals)
        # a cooling break taken between this callback's two hooks is not training time
        spent = self.clock() - self._t0 - (cooling_s(self._breaks) - self._cooling0)
        return {
            **self.totals,
            "train_s": self.totals["train_s"] + spent,
            "samples": self.totals["samples"] + self._batch["samples"],
            "tokens": self.totals["tokens"] + self._batch["tokens"],
        }

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, *args: Any
    ) -> None:
        now = self.clock()
        self.totals, self._batch = self._batch_totals(trainer), None
        self._epoch = trainer.current_epoch
        step = trainer.global_step
        if step == self._last_step or step % (self.every_n or trainer.log_every_n_steps):
            return
        self._last_step = step
        self.totals = _settled(self.totals)  # one device sync per plot point, not per step
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        samples = self.totals["samples"] - self._point["samples"]
        point = {
            "step": step,
            "loss": float(loss) if isinstance(loss, Tensor) else None,
            "samples_per_s": samples / max(now - self._point["t"], 1e-9),
        }
        self._point = {"t": now, "samples": self.totals["samples"]}
        for logger in trainer.loggers:  # the curve, where the trackers can show it too
            logger.log_metrics({"train/samples_per_s": point["samples_per_s"]}, step=step)
        for cb in trainer.callbacks:
            if isinstance(cb, PlotsPoints):
                point.update(cb.plot_point())
        self.history.append(point)
        if len(self.history) > self.max_points:
            self.history = self.history[::2]

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        values = {
            k: float(v)
            for k, v in trainer.callback_metrics.items()
            if k.startswith("val") and v.numel() == 1
        }
        if values:
            point = {"step": trainer.global_step, **values}
            self.val_history = [p for p in self.val_history if p["step"] != point["step"]]
            self.val_history.append(point)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        reason, signum = stop_reason(trainer.callbacks), signal_stop(trainer.callbacks)
        if signum:
            self.status = (
                f"interrupted ({signal.Signals(signum).name}); resume with the same command"
            )
        elif reason:
            self.status = f"stopped ({reason}); resume with the same command"
        else:
            early = ended_early(trainer.callbacks)
            self.status = f"finished: {early}" if early else "finished"
        self.write(trainer)
        self._send_to_loggers(trainer)

    @override
    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # trainer.test(ckpt_path=...) restores every callback's state from that (older) checkpoint,
        # so only the test metrics are added to the report written at the end of fit; its plot
        # (losses and validation over steps) stays as drawn then.
        if self._report is None:
            self.write(trainer)
            return
        self._report["metrics"].update(_scalars(trainer))
        self._write(trainer, self._report, plot=False)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.status = f"interrupted ({type(exception).__name__})"
        self.write(trainer)

    def wall_s(self) -> float:
        return self._wall_before + self.clock() - self._session_start

    def write(self, trainer: pl.Trainer) -> None:
        """Build the report from this callback's totals and the other guards; write the files."""
        self._report = self.build(trainer)
        self._write(trainer, self._report)

    @rank_zero_only
    def _write(self, trainer: pl.Trainer, report: dict[str, Any], plot: bool = True) -> None:
        self.path = write_report(Path(self.output_dir or trainer.default_root_dir), report, plot)

    @rank_zero_only
    def _send_to_loggers(self, trainer: pl.Trainer) -> None:
        """The report's figures for every logger at the fit's last step as ``run/<section>/<key>``,
        and the best checkpoint's path for MLflow's tags and W&B's summary."""
        if self._report is None or not trainer.loggers:
            return
        metrics = summary_metrics(self._report)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        best = self._report.get("checkpoint", {}).get("best")
        if best:
            log_text(trainer.loggers, {"best_checkpoint": str(best)})

    def build(self, trainer: pl.Trainer) -> dict[str, Any]:
        self.totals = _settled(self.totals)
        wall, t = self.wall_s(), self.totals
        sections = report_sections(trainer.callbacks)
        if not any(k.startswith("peak_") for k in sections.get("memory", {})):
            sections["memory"] = process_memory()  # the memory monitor is off (CPU profiles)
        train_s = max(t["train_s"], 1e-9)
        folder = Path(self.output_dir or trainer.default_root_dir)
        scalars = _scalars(trainer)
        run = self._run_section(trainer, folder, scalars)
        checkpoint = _checkpoint_section(trainer, folder)
        return {
            "run": run,
            "hardware": {
                "profile": self.profile,
                "accelerator": type(trainer.accelerator).__name__,
                "device": str(trainer.strategy.root_device),
                "precision": str(trainer.precision),
                **machine_facts(),
            },
            "versions": package_versions(),
            "time": {
                "wall_s": wall,
                "train_s": t["train_s"],
                "cooling_s": cooling_s(trainer.callbacks),
            },
            "throughput": {
                "samples": t["samples"],
                "tokens": t["tokens"] or None,
                "samples_per_s": t["samples"] / train_s,
                "tokens_per_s": t["tokens"] / train_s if t["tokens"] else None,
                "samples_per_s_wall": t["samples"] / max(wall, 1e-9),
            },
            # the guards' sections (memory, thermal, oom, power) are always there, empty without the guard
            **{name: {} for name in GUARD_SECTIONS},
            **sections,
            "checkpoint": checkpoint,
            "metrics": {k: v for k, v in scalars.items() if not k.startswith("lr-")},
            "history": self.history,
            "val_history": self.val_history,
        }

    def _run_section(
        self, trainer: pl.Trainer, folder: Path, scalars: Mapping[str, float]
    ) -> dict[str, Any]:
        """The report's ``run`` section: name, status, times, step and epoch, limits, learning rates."""
        run = {
            "name": folder.name,
            "status": self.status,
            "started_at": self.started_at,
            "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "sessions": self.totals["sessions"],
            "global_step": trainer.global_step,
            # 1-based, of the last trained batch (a stop mid-epoch is not "done")
            "epoch": self._epoch + 1,
        }
        if trainer.max_epochs and trainer.max_epochs > 0:
            run["max_epochs"] = trainer.max_epochs
        if trainer.max_steps and trainer.max_steps > 0:
            run["max_steps"] = trainer.max_steps
        run.update({k: v for k, v in scalars.items() if k.startswith("lr-")})
        return run

    def saved_state(self) -> dict[str, Any]:
        # a checkpoint saved by an earlier callback's on_train_batch_end (a stop) includes this batch
        totals = {**_settled(self._batch_totals(self._trainer)), "wall_s": self.wall_s()}
        return {
            "totals": totals,
            "history": self.history,
            "val_history": self.val_history,
            "started_at": self.started_at,
            "epoch": self._trainer.current_epoch if self._batch else self._epoch,
        }

    def reset_state(self) -> None:
        self._reset_totals()

    def restore_state(self, state_dict: Mapping[str, Any]) -> None:
        self.totals = dict(state_dict["totals"])
        self._wall_before = self.totals["wall_s"]
        self.history = list(state_dict["history"])
        self.val_history = list(state_dict.get("val_history", []))  # absent in older checkpoints
        self.started_at = state_dict["started_at"]
        self._epoch = state_dict["epoch"]


def _scalars(trainer: pl.Trainer) -> dict[str, float]:
    return {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}


def _checkpoint_section(trainer: pl.Trainer, folder: Path) -> dict[str, Any]:
    """The report's ``checkpoint`` section: the last and best checkpoints, the resume command."""
    best = best_checkpoint(trainer)
    checkpoint = {"last": str(run_last_checkpoint(folder))}
    if best:
        checkpoint.update(best=best[0], monitor=best[1], best_score=best[2])
    command = resume_command(folder)
    if command:
        checkpoint["resume"] = command
    return checkpoint


# The report's sections whose numbers go to the loggers at the end of fit.
SUMMARY_SECTIONS = ("time", "throughput", *GUARD_SECTIONS, "checkpoint")


def summary_metrics(report: Mapping[str, Any]) -> dict[str, float]:
    """``run/<section>/<key>``: each finite number of a :data:`SUMMARY_SECTIONS` section."""
    metrics = {}
    for section in SUMMARY_SECTIONS:
        for key, value in (report.get(section) or {}).items():
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if number and math.isfinite(value):
                metrics[f"run/{section}/{key}"] = float(value)
    return metrics


def process_memory() -> dict[str, Any]:
    """This process's peak resident memory this session (MiB despite the key), for runs without the
    memory monitor."""
    mb = process_peak_bytes() / 1024**2
    return {"peak_process_rss_mb": round(mb, 1), "source": "VmHWM (memory monitor off)"}


def _settled(totals: dict[str, Any]) -> dict[str, Any]:
    """``totals`` with the token count read from the device (it adds up there between reports)."""
    return {**totals, "tokens": int(totals["tokens"])}
