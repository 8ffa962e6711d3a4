"""A user's own datamodule under several processes gets one share of the data per process, the
way Lightning's distributed sampler gives it, while laptrain's own datamodules keep their own
samplers (issue 35, item 6)."""

from __future__ import annotations

import os
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from laptrain.callbacks.contracts import stop_reason
from laptrain.callbacks.session_budget import SessionBudget
from laptrain.config.check import check_trainer_values
from laptrain.data.user_loaders import ResumableTrainLoader, prepare_user_loaders
from laptrain.exit_codes import PAUSED_EXIT
from tests.conftest import quiet_trainer, run_train
from tests.test_scale_out_runs import final_weights, largest_difference
from tests.test_user_errors import train_user
from tests.test_user_resume import user_env, write_user_project


def one_or_two(args: list[str], start: str, folder: Path, env: dict, monkeypatch):
    """The 1-process run in this process (train_user); the run on 2 processes from a process of
    its own, which starts them."""
    if start == "here":
        return train_user(args, folder, folder, monkeypatch)
    return run_train(args, folder, env=env, timeout=300)


@pytest.mark.slow  # ~30 s: a run on 2 spawned processes and one on 1
def test_two_processes_at_batch_8_train_like_one_at_batch_16(tmp_path, monkeypatch):
    """Before: every process trained on the whole train split (60 steps instead of 30 in 2
    epochs) and the weights ended 0.26 apart from 1 process at batch 16."""
    args = [*write_user_project(tmp_path), "trainer.max_epochs=2"]
    env = user_env(tmp_path)
    for run, extra, start in (
        ("one", ["data.batch_size=16"], "here"),
        ("two", ["data.batch_size=8", "trainer=ddp_cpu"], "processes"),
    ):
        done = one_or_two([*args, *extra, f"run_name={run}"], start, tmp_path, env, monkeypatch)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "done at global step 30" in done.stdout
    one, two = final_weights(tmp_path, "one"), final_weights(tmp_path, "two")
    assert largest_difference(one, two) < 1e-5  # measured 1.0e-7


def test_use_distributed_sampler_true_is_refused_only_for_laptrains_datamodules():
    user = check_trainer_values({"use_distributed_sampler": True}, "mytask.BlobsDataModule")
    assert user == []
    ours = check_trainer_values(
        {"use_distributed_sampler": True},
        "laptrain.families.classifier.text_classification.TextClassificationDataModule",
    )
    assert len(ours) == 1 and "leave it null" in ours[0]


class UserData(pl.LightningDataModule):
    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.arange(8)), batch_size=2, shuffle=True)


class ShardingData(UserData):
    shards_itself = True


def test_a_users_datamodule_gets_lightnings_sampler_and_a_resumable_train_loader():
    data = UserData()
    assert prepare_user_loaders(data, None) is True
    assert isinstance(data.train_dataloader, ResumableTrainLoader)
    assert prepare_user_loaders(UserData(), False) is False  # the config's false wins


def test_a_datamodule_that_shards_itself_keeps_its_loaders_and_lightnings_sampler_off():
    data = ShardingData()
    assert prepare_user_loaders(data, None) is False
    assert "train_dataloader" not in vars(data)


@pytest.mark.slow  # ~35 s: a run on 2 FSDP CPU processes and one on 1
def test_a_users_module_under_fsdp_trains_like_one_process_and_tests_its_best_checkpoint(
    tmp_path, monkeypatch
):
    """A user's MLP has no layer class for FSDP units, so FSDP wraps its root alone; the test
    after the fit ran on the fitted module, whose parameters were views of the flat shard
    ("size mismatch ... torch.Size([0])"). Now it is built again and tested like laptrain's own."""
    args = [*write_user_project(tmp_path), "trainer.max_epochs=2"]
    env = user_env(tmp_path)
    fsdp = [
        "trainer=fsdp",
        "trainer.accelerator=cpu",
        "trainer.strategy._target_=tests.sharded_on_cpu.ShardedOnCPU",
    ]
    for run, extra, start in (
        ("one", ["data.batch_size=16"], "here"),
        ("two", ["data.batch_size=8", *fsdp], "processes"),
    ):
        done = one_or_two([*args, *extra, f"run_name={run}"], start, tmp_path, env, monkeypatch)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "test:" in done.stdout
    one, two = final_weights(tmp_path, "one"), final_weights(tmp_path, "two")
    assert largest_difference(one, two) < 1e-5


@pytest.mark.slow  # ~45 s (2 shared cores): two runs on 2 spawned processes
def test_a_spawned_run_paused_by_the_session_budget_exits_75_and_its_rerun_finishes(tmp_path):
    """Before: the stop reason stayed in the spawned processes; the main process exited 0 and
    printed "done at global step 0", so a shell loop rerunning on 75 ended at step 15 of 30."""
    args = [
        *write_user_project(tmp_path),
        "data.batch_size=8",
        "trainer=ddp_cpu",
        "trainer.max_epochs=2",
        "callbacks.session_budget.max_epochs=1",
    ]
    # this checkout's laptrain in the run, as in the test process
    env = {"PYTHONPATH": f"{user_env(tmp_path)['PYTHONPATH']}:{os.environ.get('PYTHONPATH', '')}"}
    paused = run_train(args, tmp_path, env=env, timeout=300)
    assert paused.returncode == PAUSED_EXIT, paused.stderr[-3000:]
    assert "stopped (session) at global step 15" in paused.stdout
    rerun = run_train(args, tmp_path, env=env, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "done at global step 30" in rerun.stdout


def test_a_spawned_fit_hands_its_callbacks_outcome_to_the_main_process():
    """The fast twin: rank 0's pause reason reaches the main process's callback by Lightning's
    route back (``get_extra_results`` in rank 0, ``update_main_process_results`` in the main)."""
    from laptrain.ranks.spawned import carry_outcomes_back

    main, rank0 = (
        quiet_trainer(
            accelerator="cpu", devices=2, strategy="ddp_spawn", callbacks=[SessionBudget(1)]
        )
        for _ in range(2)
    )
    carry_outcomes_back(main.strategy)
    next(cb for cb in rank0.callbacks if isinstance(cb, SessionBudget)).stop_reason = "session"
    launcher = main.strategy.launcher
    launcher.update_main_process_results(main, launcher.get_extra_results(rank0))
    assert stop_reason(main.callbacks) == "session"
