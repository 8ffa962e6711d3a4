"""EpochProgressBar: "Epoch 1/3" for the first of three epochs (Lightning's own says "Epoch 0/2")."""

from __future__ import annotations

import io
import re

import lightning.pytorch as pl
from lightning.pytorch.demos.boring_classes import BoringModel

from laptrain.callbacks.progress_bar import EpochProgressBar


def console() -> dict:
    return {"file": io.StringIO(), "force_terminal": False, "width": 120}


def fit_with(bar: EpochProgressBar, **trainer_args) -> None:
    """A fit of a BoringModel (2 training batches, 1 validation batch unless given) under ``bar``."""
    trainer_args = {"limit_train_batches": 2, "limit_val_batches": 1, **trainer_args}
    trainer = pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[bar],
        **trainer_args,
    )
    trainer.fit(BoringModel())


def bar_text(**trainer_args) -> str:
    kwargs = console()
    fit_with(EpochProgressBar(leave=True, console_kwargs=kwargs), **trainer_args)
    return kwargs["file"].getvalue()


def test_epochs_count_from_one_to_max_epochs():
    text = bar_text(max_epochs=3)
    assert "Epoch 1/3" in text and "Epoch 3/3" in text
    assert re.findall(r"Epoch \d+/\d+", text) == ["Epoch 1/3", "Epoch 2/3", "Epoch 3/3"]


def test_without_an_epoch_limit_only_the_epoch_shows():
    text = bar_text(max_epochs=-1, max_steps=4)
    assert "Epoch 2 " in text and "Epoch 2/" not in text


def test_a_fast_epoch_is_drawn_a_few_times_and_ends_on_its_last_batch(monkeypatch):
    """Each drawing reads every logged metric (a device sync on MPS and CUDA): at 10 a second, 60
    sub-millisecond steps are drawn a few times, not 60, and the bar still ends at 60/60."""
    kwargs = console()
    bar = EpochProgressBar(refresh_rate=10, leave=True, console_kwargs=kwargs)
    reads = []
    real = bar.get_metrics
    monkeypatch.setattr(bar, "get_metrics", lambda *a: reads.append(1) or real(*a))
    fit_with(bar, max_epochs=1, limit_train_batches=60, limit_val_batches=0)
    assert len(reads) < 20, len(reads)  # Lightning's bar: one read per batch (60) and more
    assert "60/60" in kwargs["file"].getvalue()
