"""Out-of-memory in a training step halves the micro-batch instead of ending the run."""

from __future__ import annotations

import gc
import math
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from laptrain.callbacks.contracts import BackPropagatesInChunks, VersionedState
from laptrain.callbacks.smaller_loader import (
    cut_loader,
    cuttable_loader,
    optimizers_cleared,
    smaller_divisor,
)
from laptrain.hardware.probe import DeviceProbe, probe_for
from laptrain.ranks.processes import wraps_the_module

# What each device really raises (docs/hardware.md §7): CUDA torch.OutOfMemoryError; MPS a plain
# RuntimeError "MPS backend out of memory (...)" or "Invalid buffer size: ..."; CPU
# "DefaultCPUAllocator: can't allocate memory: ...".
OOM_MARKERS = ("out of memory", "Invalid buffer size", "can't allocate memory")

GIVE_UP_HINT = (
    "one sample does not fit: shorten sequences (data.max_length), use a smaller model or bf16 "
    "weights, enable gradient checkpointing, or close other applications"
)


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in OOM_MARKERS)


class OOMBackoff(VersionedState, Callback):
    """Halve the micro-batch on OOM and redo the same optimizer step with more accumulation.

    Lightning lets an OOM end the run. A ``ChunkedBackward`` module retries only the failed part;
    any other restarts the step on a loader of smaller batches accumulated more often
    (``laptrain.callbacks.smaller_loader``): the effective batch and step count stay those of an
    uninterrupted run."""

    report_section = "oom"
    STATE_VERSION = 1
    STATE_NAME = "oom_backoff"
    STATE_RESETS = "the micro-batch (full batch) and events"

    def __init__(
        self,
        enabled: bool = True,
        every_n_steps: int | None = None,
        probe: DeviceProbe | None = None,
    ) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(
                "oom_backoff.every_n_steps must be >= 1 (or null for log_every_n_steps)"
            )
        self.enabled, self.every_n, self.probe = enabled, every_n_steps, probe
        self.micro_batch: int | None = None
        # Owned here; a ``SplitsMicroBatch`` client (ThermalGuard while hot) sets it.
        self.chunk_divisor = 1
        self.events: list[dict[str, Any]] = []
        self.batch_size, self.chunks = 0, 0
        self._last_step, self._pending = -1, False
        self.not_applied: str | None = None  # why a module's OOM ends the run (the report says)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.probe is None:
            self.probe = probe_for(trainer.strategy.root_device)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        inactive = self.inactive_because(trainer, pl_module)
        if inactive:
            rank_zero_info(inactive)
        elif self.micro_batch is not None:
            rank_zero_info(f"oom_backoff: resuming with micro-batch {self.micro_batch}")

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A module with Lightning's own backward: the train loader is cut on an OOM."""
        if not self.enabled or isinstance(pl_module, BackPropagatesInChunks):
            return
        loader = cuttable_loader(trainer)
        if self.not_applied is None and (not pl_module.automatic_optimization or loader is None):
            self.not_applied = (
                f"{type(pl_module).__name__} optimizes manually"
                if loader is not None
                else "its train loader is not one laptrain rebuilt (an IterableDataset, or a "
                "sampler of its own), so it cannot be cut mid-epoch"
            ) + ": an out-of-memory error ends the run"
        if self.not_applied or loader is None:  # (set at fit start under DDP / FSDP)
            self.on_train_batch_end = None  # type: ignore[assignment]  # off Lightning's dispatch
            return
        if self.micro_batch is not None and self.micro_batch < loader.batch_size:
            cut_loader(trainer, self.micro_batch, resumed=True)
            self.batch_size, self.chunks = self.micro_batch, 1
        loop = trainer.fit_loop.epoch_loop
        advance = loop.advance

        def advance_or_back_off(data_fetcher: Any) -> None:
            while True:
                failure = None
                try:
                    return advance(data_fetcher)
                except Exception as exc:  # only out-of-memory errors are kept
                    if not is_oom(exc):
                        raise
                    failure = f"{type(exc).__name__}: {exc}"
                self.cut_after_oom(failure, trainer)  # outside except: the batch is freed

        loop.advance = advance_or_back_off

    def cut_after_oom(self, failure: str, trainer: pl.Trainer) -> None:
        """Start the interrupted optimizer step over on smaller batches of the train loader."""
        optimizers_cleared(trainer)
        size = cuttable_loader(trainer).batch_size
        new = self.handle_oom(failure, size, trainer, smaller_divisor(size) if size > 1 else 1)
        cut_loader(trainer, new)
        self.batch_size, self.chunks = new, 1

    def inactive_because(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> str | None:
        """Why OOMs end this run (one line); None when the backoff or the loader handles them."""
        if not self.enabled:
            return None
        if not isinstance(pl_module, BackPropagatesInChunks):
            if wraps_the_module(trainer.strategy):
                self.not_applied = (
                    f"under {type(trainer.strategy).__name__} an out-of-memory error ends the run"
                )
            return None
        if wraps_the_module(trainer.strategy):
            return (
                "oom_backoff: inactive with more than one process (DDP refuses a backward inside "
                "its forward, so whole batches go through Lightning's backward)"
                if trainer.world_size > 1
                else f"oom_backoff: inactive under {type(trainer.strategy).__name__} (it runs "
                "training_step inside its wrapper's forward, so whole batches go through "
                "Lightning's backward)"
            )
        return None

    def chunk_size(self, batch_size: int) -> int:
        if not self.enabled:
            return batch_size
        size = batch_size if self.micro_batch is None else min(self.micro_batch, batch_size)
        return max(1, math.ceil(size / self.chunk_divisor))

    def set_chunk_divisor(self, divisor: int) -> None:
        """Divide every micro-batch by ``divisor`` from the next batch on (1 = undivided)."""
        if divisor < 1:
            raise ValueError(f"oom_backoff: the chunk divisor must be >= 1, got {divisor}")
        self.chunk_divisor = divisor

    def handle_oom(
        self, message: str, size: int, trainer: pl.Trainer, new: int | None = None
    ) -> int:
        """Free memory after an OOM on ``size`` samples; return the new micro-batch (``new``, or
        half)."""
        gc.collect()
        self.probe.empty_cache()
        first_line = message.splitlines()[0][:300]
        if size <= 1:
            raise RuntimeError(
                f"oom_backoff: out of memory at micro-batch 1; {GIVE_UP_HINT}. {first_line}"
            )
        new = math.ceil(size / 2) if new is None else new
        self.micro_batch = min(self.micro_batch or size, new)
        step = trainer.global_step + 1  # the optimizer step being computed, as loggers number it
        self.events.append({"step": step, "from": size, "to": new, "error": first_line})
        self._pending = True
        warn = rank_zero_warn if len(self.events) == 1 else rank_zero_info
        warn(
            f"oom_backoff: out of memory in step {step} with micro-batch {size}; "
            f"retrying with {new} (same effective batch). Lower hardware.batch_size to start there."
        )
        return new

    def step_done(self, batch_size: int, chunks: int, trainer: pl.Trainer) -> None:
        """Called by ``backward_in_chunks`` after every batch."""
        self.batch_size, self.chunks = batch_size, chunks

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if not self.enabled:
            return
        if not self.chunks:  # the backoff does not apply: said once at start (on_fit_start)
            return
        step = trainer.global_step
        due = step % (self.every_n or trainer.log_every_n_steps) == 0 and step != self._last_step
        if not (due or self._pending):
            return
        self._last_step, self._pending = step, False
        accumulate = trainer.accumulate_grad_batches
        metrics = {
            "oom/micro_batch": float(self.chunk_size(self.batch_size)),
            "oom/accumulation": float(self.chunks * accumulate),
            "oom/effective_batch": float(self.batch_size * accumulate),
            "oom/backoffs": float(len(self.events)),
        }
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)

    def summary(self) -> dict[str, Any]:
        """What the run report shows."""
        return {
            "backoffs": len(self.events),
            "micro_batch": self.chunk_size(self.batch_size)
            if self.batch_size
            else self.micro_batch,
            "chunks_per_batch": self.chunks,
            "events": self.events,
            **({"not_applied": self.not_applied} if self.not_applied else {}),
        }

    def saved_state(self) -> dict[str, Any]:
        return {
            "micro_batch": self.micro_batch,
            "events": self.events,
        }

    def reset_state(self) -> None:
        self.micro_batch, self.events = None, []

    def restore_state(self, state_dict: Mapping[str, Any]) -> None:
        self.micro_batch = state_dict["micro_batch"]
        self.events = list(state_dict["events"])
