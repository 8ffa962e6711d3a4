"""EMA callback: warm-up decay, EMA in validation and in the saved weights, raw weights for resume."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from laptrain.callbacks.ema import EMA


class ManualLinear(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.automatic_optimization = False
        self.seen_in_validation: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = self.layer(batch[0]).square().mean()
        self.manual_backward(loss)
        opt.step()
        return loss

    def validation_step(self, batch, batch_idx):
        self.seen_in_validation.append(self.layer.weight.detach().clone())
        self.log("val/acc", -self.layer(batch[0]).square().mean())

    def test_step(self, batch, batch_idx):
        self.log("test/acc", -self.layer(batch[0]).square().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader():
    torch.manual_seed(0)
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(32, 4)), batch_size=4
    )


def test_decay_warms_up_to_its_target() -> None:
    ema = EMA(decay=0.99)
    assert ema.current_decay() == pytest.approx(0.1)
    ema.updates = 10_000
    assert ema.current_decay() == 0.99
    with pytest.raises(ValueError, match="ema_decay"):
        EMA(decay=1.0)


def test_validation_checkpoint_and_test_use_the_ema(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, ema = ManualLinear(), EMA(decay=0.9)
    ckpt = ModelCheckpoint(dirpath=tmp_path, monitor="val/acc", mode="max", save_top_k=1)
    trainer = pl.Trainer(
        max_epochs=2,
        callbacks=[ema, ckpt],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader(), loader())
    assert ema.updates == trainer.global_step == 16
    saved = torch.load(ckpt.best_model_path, weights_only=True)
    raw = saved["callbacks"]["EMA"]["raw_weights"]["layer.weight"]
    ema_weight = saved["state_dict"]["layer.weight"]
    assert not torch.equal(raw, ema_weight)
    # validation ran on the EMA weights, and training continued from the raw ones
    assert any(torch.equal(w, ema_weight) for w in model.seen_in_validation)
    trainer.test(model, loader(), ckpt_path="best")
    torch.testing.assert_close(model.layer.weight.detach(), ema_weight)
