"""submitit's time-limit / preemption signal (USR2 unless ``SUBMITIT_PREEMPT_SIGNAL`` says
otherwise): every rank stops at a step boundary with ``last.ckpt``, then submitit's own handler
requeues the job, and the requeued job ends exactly where a run never stopped ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from laptrain.callbacks.graceful_stop import (
    GracefulStop,
    hand_over_to_submitit,
    submitit_preempt_signal,
)
from tests.conftest import quiet_trainer, run_train, tiny_classifier_job
from tests.fake_ranks import end_fit, two_ranks
from tests.same_state import assert_same
from tests.test_graceful_stop import SignalAtStep

ROOT = Path(__file__).resolve().parents[1]


def submitits_own_reading(environ: dict[str, str]) -> str:
    """The signal submitit's job environment uses, read by submitit in a fresh process (it reads
    ``SUBMITIT_PREEMPT_SIGNAL`` once, when imported)."""
    env = {k: v for k, v in os.environ.items() if k != "SUBMITIT_PREEMPT_SIGNAL"}
    code = "from submitit import JobEnvironment as J; print(J._usr_sig().name)"
    done = subprocess.run(
        [sys.executable, "-c", code], env={**env, **environ}, capture_output=True, text=True
    )
    return done.stdout.strip()


def test_the_signal_is_the_one_submitit_sends_and_only_inside_a_submitit_job():
    for extra in ({}, {"SUBMITIT_PREEMPT_SIGNAL": "USR1"}):
        ours = submitit_preempt_signal({"SUBMITIT_EXECUTOR": "slurm", **extra})
        assert ours is not None and ours.name == submitits_own_reading(extra)
    assert submitit_preempt_signal({"SUBMITIT_EXECUTOR": "local"}) == signal.SIGUSR2
    assert submitit_preempt_signal({}) is None  # a run not started by submitit
    assert submitit_preempt_signal({"SUBMITIT_PREEMPT_SIGNAL": "USR1"}) is None


class Checkpointable:
    """A job function submitit can requeue (it has ``checkpoint``), as Hydra's launcher is."""

    def __call__(self) -> None:
        return None

    def checkpoint(self, *args, **kwargs):
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args, **kwargs)


@pytest.fixture
def submitit_job(tmp_path, monkeypatch):
    """This process as task 0 of a submitit local job: submitit's real ``SignalHandler`` holds
    its signal, as after ``process_job``; the requeue and the exit are recorded instead."""
    from submitit.core.job_environment import SignalHandler
    from submitit.core.utils import DelayedSubmission, JobPaths
    from submitit.local.local import LocalJobEnvironment

    for key, value in {
        "SUBMITIT_EXECUTOR": "local",
        "SUBMITIT_LOCAL_JOB_ID": "7",
        "SUBMITIT_LOCAL_GLOBALID": "0",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    env = LocalJobEnvironment()
    calls: list[str] = []
    monkeypatch.setattr(env, "_requeue", lambda countdown: calls.append(f"requeue {countdown}"))
    delayed = DelayedSubmission(Checkpointable())
    delayed.set_timeout(timeout_min=60, max_num_timeout=3)
    paths = JobPaths(tmp_path / "submitit", job_id="7", task_id=0)
    paths.folder.mkdir(parents=True)
    handler = SignalHandler(env, paths, delayed)
    monkeypatch.setattr(handler, "_exit", lambda: calls.append("exit"))
    before = signal.signal(signal.SIGUSR2, handler.checkpoint_and_try_requeue)
    yield handler, paths, calls
    signal.signal(signal.SIGUSR2, before)


def test_submitits_signal_stops_at_a_step_boundary_then_submitit_requeues(tmp_path, submitit_job):
    """Before, submitit's handler ran inside the step: it requeued and exited there, with no
    ``last.ckpt``. Now the step finishes, ``last.ckpt`` is written, fit ends, and only then is
    the signal handed to submitit's handler, which pickles the job again and requeues it."""
    handler, paths, calls = submitit_job
    stop = GracefulStop()
    trainer = quiet_trainer(
        last_ckpt=tmp_path / "ckpt" / "last.ckpt",
        max_steps=50,
        callbacks=[stop, SignalAtStep(5, signum=signal.SIGUSR2)],
    )
    trainer.fit(BoringModel())
    assert calls == []  # nothing requeued from inside the step
    assert stop.signal_received == signal.SIGUSR2 and trainer.global_step == 6
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 6
    assert signal.getsignal(signal.SIGUSR2) == handler.checkpoint_and_try_requeue  # put back
    hand_over_to_submitit(128 + signal.SIGUSR2)  # what train.py does with the run's exit code
    assert calls == ["requeue 3", "exit"]
    assert paths.submitted_pickle.is_file()  # the job submitit starts again


def test_the_other_ranks_leave_fit_only_after_rank_0_put_the_stop_in_place(tmp_path, monkeypatch):
    """After a stop the ranks leave fit and exit; rank 0 then requeues. A rank that exits before
    rank 0 has moved the stop's checkpoint over ``last.ckpt`` gets rank 0 killed where the cluster
    kills a job's other tasks at a bad exit (``KillOnBadExit=1``), with ``last.ckpt`` not in place.
    So every rank meets rank 0 at a barrier after the move."""
    from laptrain.callbacks.session_budget import SessionBudget
    from laptrain.checkpoints import stop as stop_module

    clock = iter(float(s) for s in range(0, 10**6, 10))
    trainers, _ = two_ranks(
        lambda rank: SessionBudget(max_minutes=1, clock=lambda: next(clock)),
        batches=10,
    )

    def move(source, target) -> None:
        trainers[0].strategy.calls.append((trainers[0].global_step, "move"))

    monkeypatch.setattr(stop_module, "move_into_place", move)
    for trainer in trainers:
        end_fit(trainer)
    step = trainers[0].global_step
    assert trainers[0].strategy.calls[-2:] == [(step, "move"), (step, "barrier")]
    assert trainers[1].strategy.calls[-1] == (step, "barrier")  # waits there for rank 0's move


def test_other_stops_are_not_handed_over(submitit_job, monkeypatch):
    _, _, calls = submitit_job
    hand_over_to_submitit(128 + signal.SIGTERM)  # scancel, kill: stop, no requeue
    hand_over_to_submitit(0)
    monkeypatch.delenv("SUBMITIT_EXECUTOR")
    hand_over_to_submitit(128 + signal.SIGUSR2)  # not a submitit job
    assert calls == []


def final_state(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def classifier_args(tmp_path: Path) -> list[str]:
    return [
        *tiny_classifier_job(tmp_path),  # 12 batches per epoch
        "trainer.deterministic=true",
        "+trainer.limit_test_batches=2",
        "trainer.max_epochs=2",
    ]


@pytest.mark.slow  # ~55 s: submitit's local executor sends its signal 30 s into the job
def test_a_real_submitit_job_is_requeued_at_its_time_limit_and_ends_like_an_unstopped_run(tmp_path):
    """``python train.py -m hydra/launcher=submitit_local``: the executor's controller sends USR2
    30 s before the job's 1-minute limit (submitit/local/local.py:355-364) while the job is held
    at step 5; the job saves there, submitit requeues it (exit 144), and the requeued job resumes
    from step 5 and ends with the weights, optimizer and scheduler of a run never stopped. Before,
    each attempt restarted from nothing until submitit gave up ("timed-out too many times")."""
    args = classifier_args(tmp_path)
    straight = run_train([*args, "run_name=straight"], tmp_path, timeout=300)
    assert straight.returncode == 0, straight.stderr[-3000:]
    hold = [
        "+callbacks.hold._target_=tests.submitit_hooks.WaitForSignalAt",
        "+callbacks.hold.step=5",
    ]
    launcher = ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=1"]
    sweep = run_train(
        ["-m", *launcher, *args, *hold, "run_name=cut"],
        tmp_path,
        env={"PYTHONPATH": str(ROOT)},
        timeout=400,
    )
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    [log] = (tmp_path / "outputs" / "multirun" / "cut" / ".submitit").glob("*/*_0_log.out")
    text = log.read_text()
    assert "SIGUSR2: stopped at global step 5" in text
    assert "Requeued job" in text and "(global step 5, epoch 0)" in text
    [job] = (tmp_path / "outputs" / "multirun" / "cut").glob("*/checkpoints")
    a = final_state(tmp_path / "outputs" / "straight" / "checkpoints" / "last.ckpt")
    b = final_state(job / "last.ckpt")
    assert a["global_step"] == b["global_step"] == 24
    for key in ("state_dict", "optimizer_states", "lr_schedulers"):
        assert_same(a[key], b[key], key)


@pytest.mark.slow  # ~25 s: 2 processes
def test_the_signal_on_rank_0_only_stops_both_ranks_at_one_step(tmp_path):
    """A submitit job's ranks (srun tasks) that get the signal at different times, or not at
    all, stop at the same step through the all-reduce at every batch end, each with its part of
    the checkpoint written; the run exits 128 + USR2 (no submitit handler here to requeue)."""
    args = [
        *classifier_args(tmp_path),
        "trainer=ddp_cpu",
        "trainer.strategy=ddp",
        "trainer.max_epochs=1",
        "+callbacks.signal._target_=tests.rank_record.SignalAt",
        "+callbacks.signal.step=3",
        f"+callbacks.signal.signum={int(signal.SIGUSR2)}",
        "run_name=ranks",
    ]
    done = run_train(args, tmp_path, env={"SUBMITIT_EXECUTOR": "local"}, timeout=300)
    assert done.returncode == 128 + signal.SIGUSR2, done.stderr[-3000:]
    assert "SIGUSR2: stopped at global step 3" in done.stdout
    last = tmp_path / "outputs" / "ranks" / "checkpoints" / "last.ckpt"
    assert final_state(last)["global_step"] == 3
