"""Stop cleanly on Ctrl-C or SIGTERM, and always leave a ``last.ckpt`` to resume from.

Gap filled: Lightning turns Ctrl-C into a KeyboardInterrupt wherever the step is (its
OnExceptionCheckpoint may then save mid-step) and exits 1; SIGTERM stops at a batch boundary but
exits 0, and ModelCheckpoint saves no ``last.ckpt`` when fit ends between two save points
(docs/lightning.md, "Interrupts and exit codes"). This callback turns both signals into a stop request honoured at the next batch
boundary, writes ``last.ckpt`` there and at the end of fit, and records the signal so the launcher
can exit 130 / 143 with a resume hint. A second Ctrl-C aborts at once.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from laptrain.callbacks.stop_checkpoint import StopCheckpoint
from laptrain.run_folder.layout import LAST


class GracefulStop(Callback):
    """Save ``<dirpath>/<filename>.ckpt`` at a batch boundary on SIGINT/SIGTERM and at fit end.

    Args:
        dirpath: checkpoint folder (the same as ModelCheckpoint's, so ``last`` resumes from it).
        filename: file name without ``.ckpt``.
    """

    def __init__(self, dirpath: str, filename: str = LAST) -> None:
        if not filename:
            raise ValueError("callbacks.graceful_stop.filename must not be empty")
        self.path = Path(dirpath) / f"{filename}.ckpt"
        # Saved beside last.ckpt at the stop and moved over it in on_fit_end, after every
        # ModelCheckpoint.on_train_end has rewritten last.ckpt with the epoch counted as done.
        self.stop_checkpoint = StopCheckpoint(str(self.path))
        self.signal_received: int | None = None
        self._saved_step: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.signal_received == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: stop now
        self.signal_received = signum
        rank_zero_info(
            f"{signal.Signals(signum).name} received: stopping after this batch (Ctrl-C again to abort now)"
        )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Installed here, after Lightning registered its own SIGTERM handler, so ours is the one used.
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _save(self, trainer: pl.Trainer) -> None:
        # rank 0's view for all: saving is a collective (a barrier), and another node may not see
        # the file rank 0 wrote
        current = self._saved_step == trainer.global_step and self.path.exists()
        if trainer.strategy.broadcast(current):
            return
        trainer.save_checkpoint(str(self.path), weights_only=False)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict
    ) -> None:
        # Every ModelCheckpoint here keeps save_last=True, so any save means last.ckpt is current.
        self._saved_step = trainer.global_step

    def _stop(self, trainer: pl.Trainer) -> None:
        signum = self._shared_signal(trainer)
        if signum is not None and not trainer.should_stop:
            self.signal_received = signum
            self.stop_checkpoint.stop(trainer)

    def _shared_signal(self, trainer: pl.Trainer) -> int | None:
        """The signal any rank has received, the same on every rank.

        With several processes a signal may reach one rank (a scheduler signalling the main
        process) or reach the ranks a batch apart; each deciding alone would leave one rank in the
        checkpoint's barrier while another starts the next all-reduce. So every rank takes part in
        one all-reduce (max of the signal numbers, 0 for none) at every batch end, as Lightning's
        own loop broadcasts its SIGTERM flag every step (``_broadcast_sigterm_tensor`` in
        lightning/pytorch/loops/training_epoch_loop.py), which this handler replaces."""
        if trainer.world_size == 1:
            return self.signal_received
        import torch.distributed as dist

        local = torch.tensor([self.signal_received or 0], device=trainer.strategy.root_device)
        shared = int(trainer.strategy.reduce(local, reduce_op=dist.ReduceOp.MAX).item())
        return shared or None

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        self._stop(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:  # a signal during validation: stop at its end
            self._stop(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.signal_received = self._shared_signal(trainer)
        if self.signal_received is None:
            self._save(trainer)
        self._restore()

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stop_checkpoint.put_in_place(trainer)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore()
