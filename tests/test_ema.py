"""EMA callback: warm-up decay, EMA in validation and in the saved weights, raw weights for resume."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from laptrain.families.trm.ema import EMA
from tests.conftest import quiet_trainer


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
    trainer = quiet_trainer(
        enable_checkpointing=True,
        max_epochs=2,
        callbacks=[ema, ckpt],
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


def fit_linear(
    tmp_path: Path, steps: int, precision: str, resume: Path | None = None, seed: int = 0
) -> tuple[pl.Trainer, EMA, ManualLinear]:
    torch.manual_seed(seed)
    model, ema = ManualLinear(), EMA(decay=0.9)
    trainer = quiet_trainer(
        enable_checkpointing=True,
        max_steps=steps,
        precision=precision,
        callbacks=[ema, ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)],
        default_root_dir=tmp_path,
    )
    trainer.fit(model, loader(), loader(), ckpt_path=resume)
    return trainer, ema, model


def test_shadow_is_made_after_lightning_converts_the_module(tmp_path: Path) -> None:
    # 64-true converts the module in strategy.setup, after Callback.setup: where a GPU run moves it.
    _, ema, model = fit_linear(tmp_path, 2, "64-true")
    assert model.layer.weight.dtype == torch.float64
    assert {t.dtype for t in ema.shadow.values()} == {torch.float64}


@pytest.mark.parametrize("precision", ["64-true", "bf16-true"])
def test_resume_after_the_conversion_is_bit_identical(tmp_path: Path, precision: str) -> None:
    fit_linear(tmp_path / "straight", 16, precision)
    fit_linear(tmp_path / "cut", 8, precision)  # an epoch boundary: the plain loader restarts
    (cut,) = (tmp_path / "cut").glob("*step=8.ckpt")
    _, ema, _ = fit_linear(tmp_path / "cut", 16, precision, resume=cut, seed=1)
    want = {torch.float64: torch.float64, torch.bfloat16: torch.float32}
    assert {t.dtype for t in ema.shadow.values()} == {want[ema._params()["layer.weight"].dtype]}
    (a,) = (tmp_path / "straight").glob("*step=16.ckpt")
    (b,) = (tmp_path / "cut").glob("*step=16.ckpt")
    a, b = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    assert a["callbacks"]["EMA"]["updates"] == b["callbacks"]["EMA"]["updates"] == 16
    for name in a["state_dict"]:
        assert torch.equal(a["state_dict"][name], b["state_dict"][name]), name
    raw_a, raw_b = a["callbacks"]["EMA"]["raw_weights"], b["callbacks"]["EMA"]["raw_weights"]
    for name in raw_a:
        assert torch.equal(raw_a[name], raw_b[name]), name
    if precision == "bf16-true":  # the full float32 EMA rides along beside bfloat16 weights
        shadow = b["callbacks"]["EMA"]["shadow"]
        assert {t.dtype for t in shadow.values()} == {torch.float32}
        for name in shadow:
            assert torch.equal(a["callbacks"]["EMA"]["shadow"][name], shadow[name]), name


def test_a_loaded_shadow_goes_to_the_parameters_device_and_dtype(tmp_path: Path) -> None:
    fit_linear(tmp_path, 2, "32-true")
    (path,) = tmp_path.glob("*step=2.ckpt")
    checkpoint = torch.load(path, weights_only=True)
    model, ema = ManualLinear().double(), EMA()
    ema.setup(None, model, "fit")  # type: ignore[arg-type]
    ema.on_load_checkpoint(None, model, checkpoint)  # type: ignore[arg-type]
    ema.load_state_dict(checkpoint["callbacks"]["EMA"])
    ema.on_fit_start(None, model)  # type: ignore[arg-type]
    assert ema.shadow["layer.weight"].dtype == torch.float64
    raw = checkpoint["callbacks"]["EMA"]["raw_weights"]["layer.weight"]
    assert torch.equal(model.layer.weight, raw.double())
