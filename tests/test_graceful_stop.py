import io
import json
import os
import signal
import sys
import time

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from laptrain.callbacks.graceful_stop import GracefulStop
from laptrain.callbacks.rng_state import RNGState
from laptrain.console import ask_to_stop
from laptrain.run_folder import checkpoint_request
from tests.conftest import quiet_trainer


class SignalAtStep(pl.Callback):
    """``signum`` at the start of the batches after optimizer steps ``steps`` (``times`` each)."""

    def __init__(self, *steps, signum=signal.SIGTERM, times=1):
        self.steps, self.signum, self.times = steps, signum, times

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step in self.steps:
            for _ in range(self.times):
                signal.raise_signal(self.signum)


class Saves(pl.Callback):
    """The global step of every checkpoint written."""

    def __init__(self):
        self.steps = []

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self.steps.append(trainer.global_step)


def test_signal_stops_at_a_batch_boundary_with_a_checkpoint(tmp_path):
    stop = GracefulStop()
    before = signal.getsignal(signal.SIGTERM)
    trainer = quiet_trainer(
        last_ckpt=tmp_path / "last.ckpt",
        max_steps=50,
        callbacks=[stop, SignalAtStep(5)],
    )
    trainer.fit(BoringModel())
    assert stop.signal_received == signal.SIGTERM
    assert trainer.global_step == 6  # the batch that was running finished; no more
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 6
    assert signal.getsignal(signal.SIGTERM) == before


def test_fit_end_leaves_last_ckpt_even_between_periodic_saves(tmp_path):
    stop = GracefulStop()
    trainer = quiet_trainer(
        last_ckpt=tmp_path / "last.ckpt",
        max_steps=7,
        callbacks=[stop],
    )
    trainer.fit(BoringModel())
    assert stop.signal_received is None
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 7


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    import random

    import numpy as np

    cb = RNGState()
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    torch.save(cb.state_dict(), tmp_path / "s.pt")
    expected = (torch.rand(1).item(), random.random(), np.random.rand())
    torch.manual_seed(99)
    random.seed(99)
    np.random.seed(99)
    cb.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert (torch.rand(1).item(), random.random(), np.random.rand()) == expected


def fit_with(folder, stop, *callbacks, max_steps=12):
    saves = Saves()
    before = signal.getsignal(signal.SIGINT)
    trainer = quiet_trainer(
        last_ckpt=folder / "last.ckpt", max_steps=max_steps, callbacks=[stop, *callbacks, saves]
    )
    trainer.fit(BoringModel())
    assert signal.getsignal(signal.SIGINT) == before
    return trainer, saves.steps


def test_first_ctrl_c_saves_at_the_boundary_and_training_goes_on(tmp_path, capsys):
    stop = GracefulStop()
    trainer, saves = fit_with(tmp_path, stop, SignalAtStep(4, signum=signal.SIGINT))
    assert stop.signal_received is None and trainer.global_step == 12
    assert stop.saved_on_request == [5] and saves == [5, 12]  # that batch's end, then fit's end
    assert "Ctrl-C: saved step 5 to" in capsys.readouterr().out


def test_a_double_ctrl_c_stops_at_that_batch_as_before(tmp_path):
    stop = GracefulStop()
    trainer, saves = fit_with(tmp_path, stop, SignalAtStep(4, signum=signal.SIGINT, times=2))
    assert stop.signal_received == signal.SIGINT and trainer.global_step == 5
    assert stop.saved_on_request == [] and saves == [5]
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 5


def test_a_second_ctrl_c_stops_within_the_window_and_checkpoints_again_after_it(tmp_path):
    stop = GracefulStop(second_ctrl_c_s=60)
    trainer, _ = fit_with(tmp_path, stop, SignalAtStep(3, 7, signum=signal.SIGINT))
    assert stop.saved_on_request == [4] and stop.signal_received == signal.SIGINT
    assert trainer.global_step == 8

    stop = GracefulStop(second_ctrl_c_s=0)
    trainer, _ = fit_with(tmp_path, stop, SignalAtStep(3, 7, signum=signal.SIGINT))
    assert stop.saved_on_request == [4, 8] and stop.signal_received is None
    assert trainer.global_step == 12


def test_first_ctrl_c_stop_keeps_the_old_behaviour(tmp_path):
    stop = GracefulStop(first_ctrl_c="stop")
    trainer, _ = fit_with(tmp_path, stop, SignalAtStep(4, signum=signal.SIGINT))
    assert stop.signal_received == signal.SIGINT and trainer.global_step == 5
    with pytest.raises(ValueError, match="first_ctrl_c='ask': choose checkpoint or stop"):
        GracefulStop(first_ctrl_c="ask")


class Request(pl.Callback):
    def __init__(self, run_dir, step):
        self.run_dir, self.step = run_dir, step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            checkpoint_request.ask(self.run_dir)


def test_the_request_file_saves_answers_and_goes_on(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    stale = checkpoint_request.request_file(run)
    stale.write_text("{}")  # left by an earlier process: dropped
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    stop = GracefulStop(run_dir=str(run), check_every_s=0)
    trainer, saves = fit_with(run / "checkpoints", stop, Request(run, 6))
    assert trainer.global_step == 12 and stop.signal_received is None
    assert saves == [7, 12] and stop.saved_on_request == [7]
    answer = json.loads(checkpoint_request.answer_file(run).read_text())
    assert answer["step"] == 7 and answer["path"].endswith("last.ckpt")
    assert not checkpoint_request.request_file(run).exists()


def test_a_request_waits_for_the_end_of_a_gradient_accumulation(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    stop = GracefulStop(run_dir=str(run), check_every_s=0)
    saves = Saves()
    request = Request(run, 2)
    trainer = quiet_trainer(
        last_ckpt=run / "last.ckpt",
        max_steps=6,
        accumulate_grad_batches=3,
        callbacks=[stop, request, saves],
    )
    trainer.fit(BoringModel())
    # asked in the first batch of step 3's accumulation: saved once step 3 is taken
    assert stop.saved_on_request == [3]
    assert checkpoint_request.read_answer(run)["step"] == 3


def test_ask_to_stop_reads_the_reply_or_goes_on():
    read, write = os.pipe()
    with os.fdopen(read) as stream, os.fdopen(write, "w") as typed:
        typed.write("y\n")
        typed.flush()
        assert ask_to_stop(stream, 5, lambda: False) is True
        typed.write("\n")
        typed.flush()
        started = time.monotonic()
        assert ask_to_stop(stream, 5, lambda: False) is False
        assert time.monotonic() - started < 1  # a reply ends the wait at once
        assert ask_to_stop(stream, 0.3, lambda: False) is False  # no reply: goes on
        assert ask_to_stop(stream, 5, lambda: True) is True  # a second Ctrl-C meanwhile


def test_the_question_comes_on_a_terminal_only(tmp_path, monkeypatch, capsys):
    asked = []
    monkeypatch.setattr("sys.stdin", io.StringIO())
    monkeypatch.setattr(
        "laptrain.callbacks.graceful_stop._in_the_foreground_of_a_terminal", lambda: True
    )
    monkeypatch.setattr(
        "laptrain.callbacks.graceful_stop.ask_to_stop",
        lambda stream, seconds, stopped: asked.append(seconds) or True,
    )
    stop = GracefulStop(second_ctrl_c_s=3)
    trainer, saves = fit_with(tmp_path, stop, SignalAtStep(4, signum=signal.SIGINT))
    assert asked == [3] and "Stop now? (y/N)" in capsys.readouterr().out
    # "y": stopped at that boundary, the checkpoint on request is the stop's (written once)
    assert stop.signal_received == signal.SIGINT and trainer.global_step == 5 and saves == [5]


def test_no_question_without_a_terminal_or_from_the_background():
    from laptrain.callbacks.graceful_stop import _in_the_foreground_of_a_terminal

    read, write = os.pipe()
    with os.fdopen(read) as stream, os.fdopen(write, "w"):
        saved = sys.stdin
        sys.stdin = stream
        try:
            assert _in_the_foreground_of_a_terminal() is False  # a pipe, as under CI or nohup
        finally:
            sys.stdin = saved


@pytest.mark.parametrize(
    "signum, steps",
    [(signal.SIGTERM, 7), (signal.SIGINT, 12)],  # SIGTERM stops there; one Ctrl-C goes on
)
def test_a_request_in_the_batch_of_a_signal_is_answered_by_its_save(tmp_path, signum, steps):
    run = tmp_path / "run"
    run.mkdir()
    stop = GracefulStop(run_dir=str(run), check_every_s=0)
    trainer, saves = fit_with(
        run / "checkpoints", stop, Request(run, 6), SignalAtStep(6, signum=signum)
    )
    assert trainer.global_step == steps and saves[0] == 7
    assert checkpoint_request.read_answer(run)["step"] == 7
    assert not checkpoint_request.request_file(run).exists()
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == steps
