"""SessionBudget: per-process epoch and minute budgets; two chunks equal one uninterrupted run."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint, Timer
from lightning.pytorch.demos.boring_classes import BoringModel

from laptrain.callbacks.graceful_stop import GracefulStop
from laptrain.callbacks.session_budget import SessionBudget
from tests.conftest import quiet_trainer
from tests.fake_ranks import two_ranks


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class LoggedModel(BoringModel):
    """Logs train and val loss; each step takes ``step_s`` on the fake clock."""

    def __init__(self, clock: FakeClock | None = None, step_s: float = 10.0) -> None:
        super().__init__()
        self.clock, self.step_s = clock, step_s

    def training_step(self, batch, batch_idx):
        if self.clock:
            self.clock.now += self.step_s
        out = super().training_step(batch, batch_idx)
        self.log("train/loss", out["loss"])
        return out

    def validation_step(self, batch, batch_idx):
        out = super().validation_step(batch, batch_idx)
        self.log("val/loss", out["x"])
        return out


def session(tmp_path, budget, *, max_epochs=3, max_steps=-1, resume=False, clock=None):
    """One process' worth of training with the callbacks run.train uses to save last.ckpt."""
    seed_everything(1)
    model = LoggedModel(clock)
    stop = GracefulStop()  # the run's last.ckpt, for every stop
    last = tmp_path / "ckpt" / "last.ckpt"
    # as conf/callbacks/periodic_checkpoint.yaml: its on_train_end rewrites last.ckpt (lightning 2.6)
    periodic = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=250, save_top_k=0, save_last=True
    )
    trainer = quiet_trainer(
        enable_checkpointing=True,
        accelerator="cpu",
        max_epochs=max_epochs,
        max_steps=max_steps,
        limit_train_batches=8,
        limit_val_batches=2,
        callbacks=[c for c in (budget, stop, periodic) if c],
        default_root_dir=tmp_path,
    )
    trainer.fit(model, ckpt_path=str(last) if resume else None)
    return trainer, model


def test_two_epoch_chunks_equal_one_uninterrupted_run(tmp_path):
    whole, whole_model = session(tmp_path / "whole", None)

    first_budget = SessionBudget(max_epochs=2)
    first, _ = session(tmp_path / "chunked", first_budget)
    assert first.global_step == 16 and first_budget.stopped_for_session

    second_budget = SessionBudget(max_epochs=2)
    second, model = session(tmp_path / "chunked", second_budget, resume=True)
    assert not second_budget.stopped_for_session  # the run ended on its own: nothing to resume

    assert second.global_step == whole.global_step == 24
    assert second.current_epoch == whole.current_epoch == 3
    assert second.callback_metrics.keys() == whole.callback_metrics.keys()
    for key, value in whole.callback_metrics.items():
        assert torch.equal(second.callback_metrics[key], value), key
    for name, value in whole_model.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name


def test_minutes_budget_stops_at_a_batch_boundary_and_resume_finishes(tmp_path):
    clock = FakeClock()
    budget = SessionBudget(max_minutes=1, clock=clock)  # 10 s per step: 6 steps per session
    trainer, _ = session(tmp_path, budget, max_steps=20, clock=clock)
    assert trainer.global_step == 6 and budget.stop_reason == "session"
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    # saved at the stop, in the middle of epoch 0: saved after fit, the epoch would count as done
    assert (saved["global_step"], saved["epoch"]) == (6, 0)
    assert not (tmp_path / "ckpt" / "last.ckpt.stop").exists()

    clock.now = 10_000.0  # a new process: the budget is per session, not cumulative
    budget = SessionBudget(max_minutes=1, clock=clock)
    trainer, _ = session(tmp_path, budget, max_steps=20, resume=True, clock=clock)
    assert trainer.global_step == 12 and budget.stopped_for_session


def test_lightning_max_time_would_stop_a_resumed_run_at_once(tmp_path):
    """Why this callback exists: Timer restores its elapsed time from the checkpoint (docs/lightning.md, "Timer and max_time")."""
    timer = Timer(duration={"seconds": 100})
    timer.load_state_dict({"time_elapsed": {"train": 120.0}})
    assert timer.time_remaining() < 0


def test_budget_that_runs_out_on_the_last_step_is_not_a_session_stop(tmp_path):
    clock = FakeClock()
    budget = SessionBudget(max_minutes=1, clock=clock)
    trainer, _ = session(tmp_path, budget, max_steps=6, clock=clock)
    assert trainer.global_step == 6 and budget.stop_reason is None

    budget = SessionBudget(max_epochs=1)
    trainer, _ = session(tmp_path / "epochs", budget, max_epochs=1)
    assert trainer.current_epoch == 1 and not budget.stopped_for_session


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_minutes": 0}, "session_budget.max_minutes"),
        ({"max_epochs": 0}, "session_budget.max_epochs"),
    ],
)
def test_bad_values_name_their_config_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SessionBudget(**kwargs)


def test_both_ranks_broadcast_every_batch_and_stop_on_rank_0s_clock_and_flag():
    """Rank 1's clock runs three times as fast (its own budget would end at step 2), and at step 6
    rank 1 alone has ``should_stop`` set (a callback before this one deciding alone). Both ranks
    broadcast at every batch, so rank 0 never waits alone, and both stop at rank 0's step 6."""
    clocks = [FakeClock(), FakeClock()]

    def before_batch_end(trainer) -> None:
        clocks[trainer.global_rank].now += 10.0 if trainer.global_rank == 0 else 30.0
        if trainer.global_rank == 1 and trainer.global_step == 6:
            trainer.should_stop = True

    def make(rank: int) -> SessionBudget:
        return SessionBudget(max_minutes=1, clock=clocks[rank])

    trainers, budgets = two_ranks(make, batches=10, before_batch_end=before_batch_end)
    assert trainers[0].strategy.calls == trainers[1].strategy.calls
    assert trainers[0].strategy.calls == [(s, "broadcast") for s in range(1, 7)] + [(6, "barrier")]
    assert [t.global_step for t in trainers] == [6, 6]
    assert [b.stop_reason for b in budgets] == ["session", "session"]
