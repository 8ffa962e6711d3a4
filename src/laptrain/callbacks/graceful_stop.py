"""What a user does to a running job: Ctrl-C, SIGTERM, "checkpoint now"; nothing is lost.

Lightning turns Ctrl-C into a KeyboardInterrupt mid-step and SIGTERM into an exit with no
``last.ckpt`` (docs/lightning.md, "Interrupts and exit codes"; docs/cli.md for what the user
sees). Here a stop saves at the next exact-resume boundary and exits 130 / 143; submitit's
time-limit signal stops so, then :func:`hand_over_to_submitit` requeues (docs/sweeps.md). Every
rank acts at one step: the signals travel in one all-reduce per batch end.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from types import FrameType
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from laptrain.checkpoints.stop import (
    Stops,
    at_clean_boundary,
    end_fit_now,
    last_checkpoint_of,
    queue_save,
    request_stop,
    save_last,
)
from laptrain.console import ask_to_stop, relative
from laptrain.run_folder import checkpoint_request

FIRST_CTRL_C = ("checkpoint", "stop")
# submitit's signal before a time limit or a preemption: the name (without SIG) in this variable,
# USR2 when unset (submitit/core/job_environment.py:19, 32-35, read the same way); submitit exports
# SUBMITIT_EXECUTOR in every job it starts (slurm/slurm.py:529, local/local.py:262).
PREEMPT_SIGNAL_ENV, DEFAULT_PREEMPT_SIGNAL = "SUBMITIT_PREEMPT_SIGNAL", "USR2"
# What a rank asks for at a batch end; the all-reduce takes the largest on every rank.
NO_REQUEST, FILE_REQUEST, CTRL_C_REQUEST = 0, 1, 2


def submitit_preempt_signal(environ: Mapping[str, str] | None = None) -> signal.Signals | None:
    """The signal submitit sends this job before its time limit or a preemption, or None outside
    a submitit job (or for a name this platform lacks: submitit itself refuses it at job start)."""
    env = os.environ if environ is None else environ
    if not env.get("SUBMITIT_EXECUTOR"):
        return None
    name = env.get(PREEMPT_SIGNAL_ENV, DEFAULT_PREEMPT_SIGNAL)
    try:
        return signal.Signals[f"SIG{name}"]
    except KeyError:
        return None


def hand_over_to_submitit(exit_code: int) -> None:
    """After a run stopped for submitit's signal (``exit_code`` 128 + its number), ``last.ckpt``
    written and the folder unlocked: call submitit's handler (``checkpoint_and_try_requeue``), which
    on rank 0 requeues and exits (255 on SLURM, 144 locally) or raises ``UncompletedJobError`` when
    ``max_num_timeout`` is spent (submitit/core/job_environment.py:200-230). Else: returns."""
    preempt = submitit_preempt_signal()
    if preempt is None or exit_code != 128 + preempt:
        return
    handler = signal.getsignal(preempt)
    from submitit.core.job_environment import SignalHandler

    if not isinstance(getattr(handler, "__self__", None), SignalHandler):
        return
    rank_zero_info(
        f"{preempt.name}: handing the job back to submitit, which requeues it while "
        "hydra.launcher.max_num_timeout allows; the requeued job resumes from last.ckpt"
    )
    handler(preempt, None)


class GracefulStop(Callback):
    """Stop at a batch boundary on a signal; checkpoint and go on at a first Ctrl-C or on request.
    Options: conf/callbacks/graceful_stop.yaml (``run_dir``: where ``laptrain checkpoint`` leaves
    its request; None: no requests)."""

    def __init__(
        self,
        run_dir: str | None = None,
        first_ctrl_c: str = "checkpoint",
        second_ctrl_c_s: float = 5.0,
        check_every_s: float = 1.0,
    ) -> None:
        if first_ctrl_c not in FIRST_CTRL_C:
            raise ValueError(
                f"callbacks.graceful_stop.first_ctrl_c={first_ctrl_c!r}: choose "
                f"{' or '.join(FIRST_CTRL_C)}"
            )
        self.run_dir = run_dir
        self.first_ctrl_c = first_ctrl_c
        self.second_ctrl_c_s = second_ctrl_c_s
        self.check_every_s = check_every_s
        self.signal_received: int | None = None
        self.saved_on_request: list[int] = []  # steps of the checkpoints written on request
        self._request = NO_REQUEST  # seen by this rank since the last batch end
        self._pending = NO_REQUEST  # agreed by every rank, waiting for a clean boundary
        self._ctrl_c_stops_until = -math.inf  # a Ctrl-C before this monotonic time stops
        self._next_file_check = 0.0
        self._previous: dict[int, Any] = {}
        self._preempt = submitit_preempt_signal()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT:
            if self.signal_received == signal.SIGINT:
                raise KeyboardInterrupt  # Ctrl-C while a stop is under way: abort now
            if self.first_ctrl_c == "checkpoint" and time.monotonic() > self._ctrl_c_stops_until:
                self._request = CTRL_C_REQUEST
                self._ctrl_c_stops_until = math.inf  # until the save; then second_ctrl_c_s
                rank_zero_info(
                    "Ctrl-C: saving a checkpoint after this batch, then going on "
                    "(Ctrl-C again to stop)"
                )
                return
        self.signal_received = signum
        if signum == self._preempt:
            rank_zero_info(
                f"{signal.Signals(signum).name} received (submitit's time-limit or preemption "
                "signal): saving last.ckpt after this batch, then handing the job to submitit"
            )
            return
        rank_zero_info(
            f"{signal.Signals(signum).name} received: stopping after this batch (Ctrl-C again to abort now)"
        )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        Stops.of(trainer).joined(trainer)  # it counts the saves, for the end-of-fit one
        if self.run_dir and trainer.is_global_zero:
            checkpoint_request.drop_stale_request(self.run_dir)
        # Installed here, after Lightning registered its own SIGTERM handler, so ours is the one used.
        if threading.current_thread() is not threading.main_thread():
            return
        # under submitit its signal too: its own handler would requeue from inside the step
        caught = {signal.SIGINT, signal.SIGTERM} | ({self._preempt} if self._preempt else set())
        for signum in sorted(caught):
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _look_for_request_file(self, trainer: pl.Trainer) -> None:
        """Rank 0 only (another node may not see the run folder), at most every ``check_every_s``."""
        if not self.run_dir or not trainer.is_global_zero:
            return
        now = time.monotonic()
        if now < self._next_file_check:
            return
        self._next_file_check = now + self.check_every_s
        if os.path.exists(checkpoint_request.request_file(self.run_dir)):
            self._request = max(self._request, FILE_REQUEST)

    def _shared(self, trainer: pl.Trainer) -> tuple[int | None, int]:
        """The stop signal and checkpoint request any rank has, on every rank: one all-reduce (max)
        per batch end, as Lightning's own ``_broadcast_sigterm_tensor``
        (loops/training_epoch_loop.py), which this handler replaces."""
        request, self._request = self._request, NO_REQUEST
        if trainer.world_size == 1:
            return self.signal_received, request
        import torch.distributed as dist

        local = torch.tensor(
            [self.signal_received or 0, request], device=trainer.strategy.root_device
        )
        shared = trainer.strategy.reduce(local, reduce_op=dist.ReduceOp.MAX).tolist()
        return int(shared[0]) or None, int(shared[1])

    def _act(self, trainer: pl.Trainer, batch_end: bool) -> None:
        signum, request = self._shared(trainer)
        self._pending = max(self._pending, request)
        if trainer.should_stop:
            return
        if signum is not None:
            self.signal_received = signum
            # saved beside last.ckpt, moved over it at the end of fit (laptrain/checkpoints/stop.py)
            if request_stop(trainer, "signal"):  # the stop saves; a Ctrl-C's save is dropped
                if self._pending == FILE_REQUEST:  # answered once the stop's save is written
                    queue_save(trainer, _SaveOnRequest(self, FILE_REQUEST, trainer))
                self._pending = NO_REQUEST
        elif batch_end and self._pending and at_clean_boundary(trainer):
            queue_save(trainer, _SaveOnRequest(self, self._pending, trainer))
            self._pending = NO_REQUEST

    def saved(self, trainer: pl.Trainer, reason: int) -> None:
        """After a checkpoint on request: answer the request file, or ask after a Ctrl-C."""
        step, where = trainer.global_step, relative(str(last_checkpoint_of(trainer)))
        self.saved_on_request.append(step)
        # a request file that came with a Ctrl-C, or since the last look, is answered by this save
        self._answer(trainer, only_if_asked=reason != FILE_REQUEST)
        if reason == FILE_REQUEST or trainer.should_stop:  # another callback stops here
            going_on = "" if trainer.should_stop else "; going on"
            rank_zero_info(f"checkpoint on request: saved step {step} to {where}{going_on}")
            return
        stop = False
        window = self.second_ctrl_c_s
        if trainer.is_global_zero:
            if _in_the_foreground_of_a_terminal():
                print(  # "(y/N)", not "[y/N]": the progress bar's Rich console reads [..] as markup
                    f"Ctrl-C: saved step {step} to {where}. Stop now? (y/N) "
                    f"(goes on in {window:g} s; Ctrl-C again stops) ",
                    end="",
                    flush=True,
                )
                stop = ask_to_stop(sys.stdin, window, lambda: self.signal_received is not None)
            else:
                print(
                    f"Ctrl-C: saved step {step} to {where}; going on "
                    f"(Ctrl-C again within {window:g} s stops)",
                    flush=True,
                )
        if trainer.world_size > 1:
            stop = bool(trainer.strategy.broadcast(stop))
        self._ctrl_c_stops_until = time.monotonic() + window
        if stop:  # last.ckpt was written at this very boundary: it is the stop's checkpoint
            self.signal_received = signal.SIGINT
            end_fit_now(trainer)

    def _answer(self, trainer: pl.Trainer, only_if_asked: bool = False) -> None:
        if not trainer.is_global_zero or not self.run_dir:
            return
        if only_if_asked and not checkpoint_request.request_file(self.run_dir).exists():
            return
        checkpoint_request.answer(self.run_dir, trainer.global_step, last_checkpoint_of(trainer))

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        self._look_for_request_file(trainer)
        self._act(trainer, batch_end=True)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:  # a signal during validation: stop at its end
            self._act(trainer, batch_end=False)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.signal_received, request = self._shared(trainer)
        if self.signal_received is None:  # last.ckpt even between two periodic saves
            Stops.of(trainer).save_last_unless_current(trainer)
            if FILE_REQUEST in (request, self._pending):  # fit ended before a clean boundary
                self._answer(trainer)
        self._restore()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore()


def _in_the_foreground_of_a_terminal() -> bool:
    """Whether stdin is a terminal this process may read: a background job that reads its terminal
    is stopped by SIGTTIN, so a run started with ``&`` and signalled with ``kill -INT`` goes on
    without asking."""
    try:
        fd = sys.stdin.fileno()
        return os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp()
    except (AttributeError, OSError, ValueError):
        return False


class _SaveOnRequest:
    """``last.ckpt`` written by the queued saves at the end of the batch's hooks, then
    :meth:`GracefulStop.saved` (the answer, or the question after a Ctrl-C)."""

    def __init__(self, owner: GracefulStop, reason: int, trainer: pl.Trainer) -> None:
        self.owner, self.reason = owner, reason
        self.path: str | None = str(last_checkpoint_of(trainer))

    def save(self, trainer: pl.Trainer) -> None:
        save_last(trainer)
        self.owner.saved(trainer, self.reason)

    def saved_by_another(self, trainer: pl.Trainer) -> None:
        """Another callback's stop in this batch saved this step: answer as if this save had."""
        self.owner.saved(trainer, self.reason)
