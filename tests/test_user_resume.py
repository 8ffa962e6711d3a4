"""A user's own datamodule (a plain ``DataLoader(shuffle=True)``, written the
lightning-hydra-template way, outside src/laptrain) stopped mid-epoch and rerun ends where a run
never stopped ends (issue 35, item 5): laptrain rebuilds its train loader as a resumable one
(laptrain.data.user_loaders)."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset, WeightedRandomSampler

from laptrain.data.sampler import ResumableDataLoader
from laptrain.data.user_loaders import prepare_user_loaders, resumable_train_loader
from tests import user_style
from tests.conftest import ROOT, run_train
from tests.test_user_errors import train_user


def write_user_project(folder: Path) -> list[str]:
    """tests/user_style.py's project (``mytask.py``, model=mlp, data=blobs) in ``folder``; returns
    the train.py arguments that pick it, at batch 16 (240 train rows: 15 batches an epoch)."""
    user_style.write_user_project(folder)
    return [
        "model=mlp",
        "data=blobs",
        "data.batch_size=16",
        "hardware=cpu",
        "hardware.torch_threads=1",
        *user_style.user_args(folder),
        "logger=none",
    ]


def user_env(folder: Path) -> dict[str, str]:
    return {"PYTHONPATH": f"{folder}:{ROOT}"}  # mytask, and tests.signal_at in the child


def last_checkpoint(tmp_path: Path, run: str) -> dict:
    path = tmp_path / "outputs" / run / "checkpoints" / "last.ckpt"
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_ends_equal(tmp_path: Path, straight: str, resumed: str) -> None:
    a, b = last_checkpoint(tmp_path, straight), last_checkpoint(tmp_path, resumed)
    assert a["global_step"] == b["global_step"]
    differ = [k for k, v in a["state_dict"].items() if not torch.equal(v, b["state_dict"][k])]
    assert differ == [], differ
    assert optimizer_states_equal(a["optimizer_states"], b["optimizer_states"])


def optimizer_states_equal(a, b) -> bool:
    """Whether two optimizer states hold the same keys, plain values and tensors (torch.equal:
    ``repr`` shows a tensor's first and last values only)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(optimizer_states_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(map(optimizer_states_equal, a, b))
    return a == b


def test_optimizer_states_that_differ_inside_a_tensor_are_told_apart():
    """``repr`` of a long tensor elides its middle: the resume checks compared nothing there."""
    a = {"state": {0: {"exp_avg": torch.zeros(2000)}}, "param_groups": [{"lr": 0.1}]}
    b = {"state": {0: {"exp_avg": torch.zeros(2000)}}, "param_groups": [{"lr": 0.1}]}
    b["state"][0]["exp_avg"][1000] = 1e-3
    assert repr(a) == repr(b)
    assert not optimizer_states_equal(a, b)
    assert optimizer_states_equal(a, {**a})


def stop_and_rerun(
    tmp_path: Path, monkeypatch, args: list[str], signum: str, code: int, times: int
) -> str:
    """Run ``args`` whole (run ``straight``), then stopped by ``signum`` in step 5 (run ``cut``, a
    process of its own: the signal goes to it), then rerun ``cut``; returns the rerun's console."""
    env = user_env(tmp_path)
    done = train_user([*args, "run_name=straight"], tmp_path, tmp_path, monkeypatch)
    assert done.returncode == 0, done.stderr[-3000:]
    signal = [
        "+callbacks.sig._target_=tests.signal_at.SignalAt",
        "+callbacks.sig.step=5",
        f"+callbacks.sig.signum={signum}",
        f"+callbacks.sig.times={times}",
    ]
    cut = run_train([*args, "run_name=cut", *signal], tmp_path, env=env)
    assert cut.returncode == code, cut.stderr[-3000:]
    assert last_checkpoint(tmp_path, "cut")["global_step"] == 5
    rerun = train_user([*args, "run_name=cut"], tmp_path, tmp_path, monkeypatch)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "not resumable" not in rerun.stdout + rerun.stderr
    return rerun.stdout


@pytest.mark.slow  # ~28 s: three runs through train.py
def test_sigterm_mid_epoch_and_rerun_ends_equal_to_a_run_never_stopped(tmp_path, monkeypatch):
    """Before: Lightning warned that the loader is not resumable, replayed the epoch in a new
    order, and the weights ended up to 0.11 apart."""
    args = [*write_user_project(tmp_path), "trainer.max_epochs=2", "test=false"]
    out = stop_and_rerun(tmp_path, monkeypatch, args, "SIGTERM", 143, times=1)
    assert "global step 5" in out
    assert_ends_equal(tmp_path, "straight", "cut")


@pytest.mark.slow  # ~35 s: worker processes start at each epoch of three runs
def test_double_ctrl_c_with_workers_and_rerun_ends_equal_to_a_run_never_stopped(
    tmp_path, monkeypatch
):
    args = [
        *write_user_project(tmp_path),
        "trainer.max_epochs=2",
        "test=false",
        "+data.num_workers=2",
    ]
    stop_and_rerun(tmp_path, monkeypatch, args, "SIGINT", 130, times=2)
    assert_ends_equal(tmp_path, "straight", "cut")


def blobs(n: int = 40) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def indices(loader) -> list[list[int]]:
    return [batch[0].tolist() for batch in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_rebuilt_loader_restored_serves_exactly_the_rest_of_its_epoch(workers):
    def rebuilt() -> ResumableDataLoader:
        user = DataLoader(blobs(), batch_size=4, shuffle=True, num_workers=workers)
        made, why = resumable_train_loader(user, seed=7)
        assert why == "" and isinstance(made, ResumableDataLoader)
        return made

    full = indices(rebuilt())
    assert sorted(i for b in full for i in b) == list(range(40))
    loader = rebuilt()
    it = iter(loader)
    seen = [next(it)[0].tolist() for _ in range(3)]
    state = loader.state_dict()
    del it
    restored = rebuilt()
    restored.load_state_dict(state)
    assert seen + indices(restored) == full


def test_a_rebuilt_loader_keeps_the_users_settings():
    def collate(rows):
        return rows

    user = DataLoader(blobs(10), batch_size=3, shuffle=True, drop_last=True, collate_fn=collate)
    made, _ = resumable_train_loader(user)
    assert (made.batch_size, made.drop_last, made.collate_fn) == (3, True, collate)
    assert len(made) == len(user) == 3


def test_one_process_at_2b_takes_what_two_processes_at_b_take_together():
    def ranks(replicas: int, batch: int) -> list[list[list[int]]]:
        user = DataLoader(blobs(), batch_size=batch, shuffle=True)
        return [
            indices(resumable_train_loader(user, replicas, r, seed=3)[0]) for r in range(replicas)
        ]

    (one,) = ranks(1, 8)
    zero, first = ranks(2, 4)
    assert [sorted(a + b) for a, b in zip(zero, first, strict=True)] == [sorted(b) for b in one]
    assert not set(sum(zero, [])) & set(sum(first, []))


class Stream(IterableDataset):
    def __iter__(self):
        yield from range(8)


@pytest.mark.parametrize(
    ("loader", "why"),
    [
        (DataLoader(Stream(), batch_size=2), "an IterableDataset has no position to save"),
        (
            DataLoader(blobs(8), sampler=WeightedRandomSampler([1.0] * 8, 8), batch_size=2),
            "its sampler (WeightedRandomSampler) is the datamodule's own",
        ),
        ([[1, 2], [3]], "list is not a DataLoader"),
    ],
)
def test_a_loader_that_cannot_be_rebuilt_is_left_as_it_is_and_says_why(loader, why):
    assert resumable_train_loader(loader) == (loader, why)


class StreamData(pl.LightningDataModule):
    def train_dataloader(self) -> DataLoader:
        return DataLoader(Stream(), batch_size=2)


def test_an_iterable_train_loader_says_so_in_one_line_when_fit_asks_for_it(caplog):
    data = StreamData()
    prepare_user_loaders(data, None)
    with caplog.at_level(logging.INFO):
        loader = data.train_dataloader()
    assert isinstance(loader.dataset, Stream)
    lines = [r.getMessage() for r in caplog.records if "train loader" in r.getMessage()]
    assert lines == [
        "train loader: an IterableDataset has no position to save; a run stopped mid-epoch will "
        "not resume exactly"
    ]
