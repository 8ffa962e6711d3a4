import signal

import lightning.pytorch as pl
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from laptrain.callbacks.graceful_stop import GracefulStop
from laptrain.callbacks.rng_state import RNGState
from tests.conftest import quiet_trainer


class SignalAtStep(pl.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            signal.raise_signal(signal.SIGTERM)


def test_signal_stops_at_a_batch_boundary_with_a_checkpoint(tmp_path):
    stop = GracefulStop(dirpath=str(tmp_path))
    before = signal.getsignal(signal.SIGTERM)
    trainer = quiet_trainer(
        max_steps=50,
        callbacks=[stop, SignalAtStep(5)],
    )
    trainer.fit(BoringModel())
    assert stop.signal_received == signal.SIGTERM
    assert trainer.global_step == 6  # the batch that was running finished; no more
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 6
    assert signal.getsignal(signal.SIGTERM) == before


def test_fit_end_leaves_last_ckpt_even_between_periodic_saves(tmp_path):
    stop = GracefulStop(dirpath=str(tmp_path))
    trainer = quiet_trainer(
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
