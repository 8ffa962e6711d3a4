"""Interrupted mid-epoch + resumed == uninterrupted, bit for bit on CPU (dropout included)."""

from __future__ import annotations

import signal

import lightning.pytorch as pl
import torch

from laptrain.callbacks.graceful_stop import GracefulStop
from laptrain.callbacks.rng_state import RNGState
from laptrain.families.classifier.text_classification import TextClassificationDataModule
from laptrain.families.classifier.text_classifier import TextClassifierModule
from tests.conftest import TINY_BERT as BACKBONE
from tests.conftest import quiet_trainer, write_texts


class SigtermAt(pl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            signal.raise_signal(signal.SIGTERM)


def fit(tmp_path, ckpt_dir, extra=(), ckpt_path=None):
    pl.seed_everything(7, workers=True, verbose=False)
    dm = TextClassificationDataModule(
        files={"train": str(write_texts(tmp_path / "t.csv"))},
        vocab_size=200,
        max_length=32,
        batch_size=8,
        cache_dir=str(tmp_path / "cache"),
    )
    dm.setup()
    model = TextClassifierModule(backbone=BACKBONE, **dm.model_kwargs())
    trainer = quiet_trainer(
        last_ckpt=ckpt_dir / "last.ckpt",
        max_steps=30,
        limit_val_batches=0,
        callbacks=[GracefulStop(), RNGState(), *extra],
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return trainer, model


def test_interrupted_and_resumed_run_ends_identical_to_an_uninterrupted_one(tmp_path):
    _, straight = fit(tmp_path, tmp_path / "a")
    # 192 training rows / 8 = 24 batches per epoch: stop mid-epoch at step 10, finish in epoch 2
    stopped, _ = fit(tmp_path, tmp_path / "b", extra=[SigtermAt(10)])
    assert stopped.global_step == 11
    saved = torch.load(tmp_path / "b" / "last.ckpt", weights_only=True)
    assert (saved["global_step"], saved["epoch"]) == (11, 0)  # mid-epoch, not counted as done
    resumed_trainer, resumed = fit(
        tmp_path, tmp_path / "c", ckpt_path=str(tmp_path / "b" / "last.ckpt")
    )
    assert resumed_trainer.global_step == 30
    for (name, a), (_, b) in zip(
        straight.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
