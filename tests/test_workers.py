"""DataLoader workers leave Ctrl-C and SIGTERM to the main process (laptrain.data.workers)."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch.utils.data import DataLoader, Dataset

from laptrain.data.workers import WorkerInit, worker_context


class SignalsThenWaits(Dataset):
    """Item 0 sends SIGINT and SIGTERM to its own worker process, then gives the worker's
    handlers' state; the worker must still be alive to return it."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 0:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        ignored = [signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGINT, signal.SIGTERM)]
        return torch.tensor(ignored)


def test_a_worker_survives_ctrl_c_and_sigterm_sent_to_it():
    loader = DataLoader(SignalsThenWaits(), num_workers=1, worker_init_fn=WorkerInit())
    assert [b.tolist() for b in loader] == [[[True, True]], [[True, True]]]


def test_lightning_still_seeds_the_workers_when_it_is_asked_to(monkeypatch):
    import random

    monkeypatch.setenv("PL_SEED_WORKERS", "1")
    torch.manual_seed(7)
    WorkerInit(rank=1)(worker_id=0)
    first = random.random()
    torch.manual_seed(7)
    WorkerInit(rank=1)(worker_id=0)
    assert random.random() == first  # seeded from torch's seed, worker id and rank
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class Numbers(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i


def test_a_spawned_worker_signalled_while_it_starts_survives():
    """macOS starts workers with spawn: a fresh interpreter that imports torch (a second or more)
    before worker_init_fn runs. A Ctrl-C or SIGTERM to the process group in that window killed
    the worker ("DataLoader worker ... exited unexpectedly") with the default context; with
    worker_context the worker starts with both blocked and ignores them once WorkerInit runs."""
    context = worker_context("spawn")
    assert context is not None and context.get_start_method() == "spawn"
    loader = DataLoader(
        Numbers(), num_workers=1, worker_init_fn=WorkerInit(), multiprocessing_context=context
    )
    batches = iter(loader)
    worker = batches._workers[0]
    for signum in (signal.SIGINT, signal.SIGTERM):  # still importing torch: not yet WorkerInit
        os.kill(worker.pid, signum)
    assert [b.tolist() for b in batches] == [[0], [1], [2], [3]]


def test_the_worker_context_is_only_for_spawn():
    assert worker_context("fork") is None and worker_context("forkserver") is None
