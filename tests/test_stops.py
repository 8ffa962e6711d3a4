"""A guard stops a run with one call, ``request_stop``: the save at a clean boundary, the retry
after a validation, the move over ``last.ckpt`` and the rerun are laptrain's."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from laptrain.checkpoints.stop import request_stop
from tests.conftest import quiet_trainer


class StopAtStep(Callback):
    """A new guard: asks for a stop once the run reaches ``step``, and does nothing else."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            request_stop(trainer, "test")


class FirstStep(Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        self.step = trainer.global_step


def fit(folder, callbacks, ckpt_path=None):
    trainer = quiet_trainer(
        enable_checkpointing=True,
        max_steps=12,
        val_check_interval=4,  # a validation follows step 4's batch: the stop waits for step 5
        limit_val_batches=1,
        callbacks=[
            *callbacks,
            ModelCheckpoint(dirpath=folder, save_last=True, every_n_train_steps=250),
        ],
    )
    trainer.fit(BoringModel(), ckpt_path=ckpt_path)
    return trainer


@pytest.mark.filterwarnings("ignore:.*dataloader is not resumable")
def test_a_guard_with_the_one_call_stops_cleanly_and_the_rerun_continues(tmp_path):
    stopped = fit(tmp_path, [StopAtStep(4)])
    assert stopped.global_step == 5  # not before step 4's validation: one batch later
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert (saved["global_step"], saved["epoch"]) == (5, 0)  # the epoch not counted done
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no last.ckpt.stop

    first = FirstStep()
    resumed = fit(tmp_path, [first], ckpt_path=str(tmp_path / "last.ckpt"))
    assert first.step == 5 and resumed.global_step == 12
