"""A module and datamodule written exactly as lightning-hydra-template's MNIST example
(tests/lht_style.py) train, test on their best checkpoint, resume exactly after a SIGTERM, take
the profile's batch per device and run on 2 DDP CPU ranks (issue 48, item 1). Their checkpoints
hold the network object and the partial optimizer and scheduler their config builds: loaded with
``weights_only=True`` and exactly those allowed (laptrain.checkpoints.trusted)."""

from __future__ import annotations

import sys
from pathlib import Path
from subprocess import CompletedProcess

import pytest
import torch

from tests.conftest import run_train
from tests.in_process import train_here
from tests.lht_style import lht_env, write_lht_project
from tests.test_user_resume import optimizer_states_equal


def train(args: list[str], folder: Path, monkeypatch) -> CompletedProcess:
    """``python train.py <args>`` in this process, ``user.lht_task`` imported from ``folder``."""
    for name in [m for m in sys.modules if m == "user" or m.startswith("user.")]:
        monkeypatch.delitem(sys.modules, name)
    return train_here(args, folder, env=lht_env(folder))


def last(folder: Path, run: str) -> dict:
    """A run's last.ckpt, read in full (this test's own file: the network object included)."""
    path = folder / "outputs" / run / "checkpoints" / "last.ckpt"
    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.fixture
def project(tmp_path, monkeypatch) -> list[str]:
    monkeypatch.syspath_prepend(str(tmp_path))  # for last(): the checkpoint names user.lht_task
    return write_lht_project(tmp_path)


def test_trains_and_tests_its_best_checkpoint(project, tmp_path, monkeypatch):
    """Before: the test on the best checkpoint ended in an UnpicklingError traceback (exit 1)."""
    done = train([*project, "trainer.max_epochs=2"], tmp_path, monkeypatch)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done at global step 20" in done.stdout  # 320 rows at batch 32, 2 epochs
    assert any(line.startswith("test: acc") for line in done.stdout.splitlines()), done.stdout
    saved = last(tmp_path, "lht_mnist-lht_mnist")["hyper_parameters"]
    assert type(saved["net"]).__name__ == "SimpleDenseNet"


def test_sigterm_and_rerun_ends_equal_to_a_run_never_stopped(project, tmp_path, monkeypatch):
    """Default trainer (deterministic off). Before: the rerun said ``last.ckpt is not a readable
    checkpoint`` (exit 2), so the run could never resume."""
    args = [*project, "trainer.max_epochs=2", "test=false"]
    straight = train([*args, "run_name=straight"], tmp_path, monkeypatch)
    assert straight.returncode == 0, straight.stderr[-3000:]
    signal = [
        "+callbacks.sig._target_=tests.signal_at.SignalAt",
        "+callbacks.sig.step=13",  # in the second epoch, after a validation
        "+callbacks.sig.signum=SIGTERM",
    ]
    cut = train([*args, "run_name=cut", *signal], tmp_path, monkeypatch)  # it signals itself
    assert cut.returncode == 143, cut.stderr[-3000:]
    assert last(tmp_path, "cut")["global_step"] == 13
    rerun = train([*args, "run_name=cut"], tmp_path, monkeypatch)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resuming from" in rerun.stdout
    a, b = last(tmp_path, "straight"), last(tmp_path, "cut")
    assert a["global_step"] == b["global_step"] == 20
    differ = [k for k, v in a["state_dict"].items() if not torch.equal(v, b["state_dict"][k])]
    assert differ == []
    assert optimizer_states_equal(a["optimizer_states"], b["optimizer_states"])
    assert a["lr_schedulers"] == b["lr_schedulers"]


def test_an_object_the_config_does_not_build_is_refused_in_one_line(project, tmp_path, monkeypatch):
    """Anything besides what the config builds stays refused: one line naming it and the fix."""
    done = train([*project, "trainer.max_epochs=1", "test=false"], tmp_path, monkeypatch)
    assert done.returncode == 0, done.stderr[-3000:]
    path = tmp_path / "outputs" / "lht_mnist-lht_mnist" / "checkpoints" / "last.ckpt"
    state = last(tmp_path, "lht_mnist-lht_mnist")
    state["hyper_parameters"]["criterion"] = torch.nn.CrossEntropyLoss()
    torch.save(state, path)
    rerun = train([*project, "trainer.max_epochs=2"], tmp_path, monkeypatch)
    assert rerun.returncode == 2 and "Traceback" not in rerun.stderr, rerun.stderr[-3000:]
    (line,) = [line for line in rerun.stderr.splitlines() if line.startswith("error: ")]
    assert "holds a torch.nn.modules.loss.CrossEntropyLoss, which this run's config" in line
    assert "self.save_hyperparameters(ignore=[" in line


def test_the_profiles_batch_is_the_batch_each_process_uses(project, tmp_path, monkeypatch):
    done = train(
        [*project, "data.batch_size=from_profile", "trainer.max_epochs=1", "test=false"],
        tmp_path,
        monkeypatch,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "micro batch size: 16 (hardware.batch_size, set on MNISTDataModule.batch_size_per_device)"
        in done.stdout
    )
    assert "done at global step 20" in done.stdout  # 320 rows at hardware=cpu's 16


@pytest.mark.slow  # 38 s; fast twins: its_own_batch_is_split_over_the_processes below, and
# tests/test_train_e2e.py's DDP subprocess run
def test_two_ddp_cpu_ranks_train_and_test_at_the_profiles_batch_each(project, tmp_path):
    """Before: its checkpoints did not load, and each rank ran half the batch the console
    reported (setup divided the profile's 16 by the 2 processes)."""
    args = [*project, "data.batch_size=from_profile", "trainer=ddp_cpu", "trainer.max_epochs=1"]
    done = run_train(args, tmp_path, env=lht_env(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "set on MNISTDataModule.batch_size_per_device" in done.stdout
    assert "effective batch size: 32" in done.stdout
    assert "done at global step 10" in done.stdout  # 160 rows a rank at 16
    assert any(line.startswith("test: acc") for line in done.stdout.splitlines()), done.stdout


def test_its_own_batch_is_split_over_the_processes_and_reported_so(project, tmp_path):
    from laptrain.job.datamodule_settings import find_setting, set_up

    sys.path.insert(0, str(tmp_path))
    try:
        from user.lht_task.mnist_datamodule import MNISTDataModule
    finally:
        sys.path.remove(str(tmp_path))
    data = MNISTDataModule(batch_size=32)
    set_up(data, 2, follows_profile=False)
    assert find_setting(None, data, "batch_size").value == 16
    assert data.train_dataloader().batch_size == 16
