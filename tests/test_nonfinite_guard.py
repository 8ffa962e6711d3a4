"""A NaN loss stops the run before it reaches the weights (or the step is skipped), a NaN model
is never saved as best or last, and the stop (step, loss or parameter, value, lr, precision) is in
report.json for `laptrain why`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch

from laptrain.callbacks.graceful_stop import GracefulStop
from laptrain.callbacks.model_checkpoint import ModelCheckpoint
from laptrain.callbacks.nonfinite_guard import NonFiniteGuard, NonFiniteLoss
from laptrain.callbacks.run_report import RunReport
from laptrain.commands import cli
from tests.conftest import TINY, quiet_trainer, write_texts
from tests.in_process import train_here

HOOKS = {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}


class Regressor(pl.LightningModule):
    """y = 2x; the loss of step ``nan_at`` (1-based) is NaN, as a diverged run's would be."""

    def __init__(self, nan_at: int | None = None, lr: float = 0.05) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.nan_at, self.lr = nan_at, lr

    def train_dataloader(self):
        x = torch.linspace(-1, 1, 64).unsqueeze(1)
        return torch.utils.data.DataLoader(list(zip(x, 2 * x)), batch_size=8)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        if self.nan_at is not None and self.global_step + 1 == self.nan_at:
            loss = loss * float("nan")
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_a_nan_loss_stops_before_the_update_and_names_step_checkpoint_and_causes(tmp_path):
    pl.seed_everything(0)
    model = Regressor(nan_at=6)
    straight = Regressor()
    straight.load_state_dict(model.state_dict())
    quiet_trainer(max_steps=5).fit(straight)  # where a run without the NaN stands after 5 steps

    ckpt = tmp_path / "ckpt"
    trainer = quiet_trainer(
        max_steps=20,
        enable_checkpointing=True,
        callbacks=[
            NonFiniteGuard(),
            ModelCheckpoint(dirpath=ckpt, every_n_train_steps=2, save_top_k=0, save_last=True),
            GracefulStop(),
        ],
    )
    with pytest.raises(NonFiniteLoss) as err:
        trainer.fit(model)
    message = str(err.value)
    assert "loss is nan at global step 5" in message
    assert f"{ckpt / 'last.ckpt'} (step 4;" in message
    assert "learning rate 0.05" in message and "action=skip" in message and "\n" not in message
    # the NaN step was not applied: the weights are those of 5 clean steps, all finite
    for a, b in zip(weights(model), weights(straight)):
        assert torch.equal(a, b)
    # nothing was saved after the NaN: last.ckpt is step 4's, finite
    saved = torch.load(ckpt / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 4
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values())
    assert sorted(p.name for p in ckpt.iterdir()) == ["last.ckpt"]


def test_skip_drops_the_nan_step_counts_it_and_trains_on(tmp_path):
    pl.seed_everything(0)
    model = Regressor(nan_at=3)
    guard = NonFiniteGuard(action="skip")
    before = None

    class Snapshot(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            nonlocal before
            if trainer.global_step == 2:
                before = weights(pl_module)

        def on_train_batch_end(self, trainer, pl_module, *args):
            if trainer.global_step == 3:  # the NaN step: counted, weights untouched
                for a, b in zip(before, weights(pl_module)):
                    assert torch.equal(a, b)

    with pytest.warns(UserWarning, match="loss is nan at step 2: step skipped"):
        quiet_trainer(max_steps=8, callbacks=[guard, Snapshot()]).fit(model)
    assert guard.summary() == {
        "action": "skip",
        "skipped_steps": 1,
        "skipped": [{"step": 2, "why": "loss is nan"}],
    }
    assert all(torch.isfinite(p).all() for p in model.parameters())


class Exploding(Regressor):
    """The gradient of ``layer.weight`` is -inf at step 1 while the loss stays finite."""

    def on_after_backward(self):
        if self.global_step == 1:
            self.layer.weight.grad.fill_(float("-inf"))


def test_non_finite_gradients_with_a_finite_loss_are_caught_naming_the_parameter():
    guard = NonFiniteGuard()
    with pytest.raises(
        NonFiniteLoss, match=r"^the gradient of layer\.weight is -inf at global step 1 "
    ):
        quiet_trainer(max_steps=4, callbacks=[guard]).fit(Exploding())
    assert guard.summary()["stop"] == {
        "step": 1,
        "what": "gradients",
        "parameter": "layer.weight",
        "value": "-inf",
        "lr": [0.05],
        "precision": "32-true",
    }


class Steep(Regressor):
    """Every gradient is 3e38 at step 1: near float32's largest, but finite."""

    def on_after_backward(self):
        if self.global_step == 1:
            for p in self.parameters():
                p.grad.fill_(3e38)


def test_large_finite_gradients_are_not_taken_for_non_finite_ones():
    guard = NonFiniteGuard()
    trainer = quiet_trainer(max_steps=4, callbacks=[guard])
    trainer.fit(Steep())  # the sum of their norms overflows: a check by the norms stopped here
    assert trainer.global_step == 4
    assert guard.summary() == {"action": "stop", "skipped_steps": 0, "skipped": []}


def test_the_stop_is_in_the_report_written_after_the_exception(tmp_path):
    """RunReport builds report.json in on_exception, after the guard raised: listed before the
    guard, its on_exception runs first, so the guard must have kept the record before raising."""
    model = Regressor(nan_at=4)
    callbacks = [RunReport(output_dir=str(tmp_path)), NonFiniteGuard()]
    with pytest.raises(NonFiniteLoss):
        quiet_trainer(max_steps=10, callbacks=callbacks).fit(model)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["run"]["status"] == "interrupted (NonFiniteLoss)"
    assert report["nonfinite"] == {
        "action": "stop",
        "skipped_steps": 0,
        "skipped": [],
        "stop": {"step": 3, "what": "loss", "value": "nan", "lr": [0.05], "precision": "32-true"},
    }


def test_a_clean_run_reports_no_stop():
    guard = NonFiniteGuard()
    quiet_trainer(max_steps=3, callbacks=[guard]).fit(Regressor())
    assert guard.summary() == {"action": "stop", "skipped_steps": 0, "skipped": []}


def test_an_unknown_action_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="action='pause': choose one of stop, skip"):
        NonFiniteGuard(action="pause")


def test_train_py_with_a_nan_exits_65_in_one_line_never_saves_it_and_why_names_it(tmp_path, capsys):
    data = write_texts(tmp_path / "texts.csv")
    done = train_here(
        [
            "hardware=cpu",
            "data=text_csv",
            f"data.files.train={data}",
            "run_name=t",
            *TINY,
            "callbacks.periodic_checkpoint.every_n_train_steps=3",
            "+callbacks.nan._target_=tests.signal_at.NaNAt",
            "+callbacks.nan.step=8",
        ],
        tmp_path,
        env=HOOKS,
    )
    from laptrain.exit_codes import NONFINITE_EXIT

    assert done.returncode == NONFINITE_EXIT == 65, done.stderr[-3000:]  # not 2: no bad input
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr[-3000:]
    assert "loss is nan at global step 7" in errors[0] and "(step 6;" in errors[0]
    ckpts = tmp_path / "outputs" / "t" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["last.ckpt"]
    saved = torch.load(ckpts / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 6
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values())
    # the report and `laptrain why` name the step, the loss and the lr of the error line
    lr = re.search(r"the learning rate (\S+) ", errors[0]).group(1)
    report = json.loads((tmp_path / "outputs" / "t" / "report.json").read_text())
    stop = report["nonfinite"]["stop"]
    assert {k: stop[k] for k in ("step", "what", "value", "precision")} == {
        "step": 7,
        "what": "loss",
        "value": "nan",
        "precision": "32-true",
    }
    assert f"{stop['lr'][0]:.3g}" == lr
    capsys.readouterr()
    assert cli.main(["why", str(tmp_path / "outputs" / "t")]) == 0
    finding = capsys.readouterr().out.splitlines()[1]
    assert finding.startswith(
        f"the NaN guard stopped the run at step 7: the loss was nan (lr {lr}, precision 32-true): "
        "fixes: check the data (a bad row in that batch: inputs or labels), model.optimizer.lr="
    )


class _TwoRanks:
    """A trainer of rank ``rank`` of 2 whose all-reduce (max) meets ``other``, the value the
    other rank contributes."""

    def __init__(self, rank: int, other: int) -> None:
        self.world_size, self.global_rank, self.global_step = 2, rank, 5
        self.current_epoch, self.precision = 0, "32-true"
        self.precision_plugin = SimpleNamespace()
        self.fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_idx=5))
        self.optimizers: list = []
        self.sent: list[int] = []

        def reduce(tensor, reduce_op=None):
            self.sent.append(int(tensor.item()))
            return torch.maximum(tensor, torch.tensor([other]))

        self.strategy = SimpleNamespace(root_device=torch.device("cpu"), reduce=reduce)


def test_a_rank_that_saw_nothing_skips_with_the_rank_that_did_and_names_it():
    weight = torch.nn.Parameter(torch.zeros(2))
    weight.grad = torch.ones(2)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    guard = NonFiniteGuard(action="skip")
    trainer = _TwoRanks(rank=0, other=1)  # rank 1 found one: it sends world_size - 1
    with pytest.warns(UserWarning, match="not finite on rank 1"):
        guard.on_before_optimizer_step(trainer, None, optimizer)
    assert trainer.sent == [0] and weight.grad is None
    assert guard.skipped == [{"step": 5, "why": "a loss or gradient was not finite on rank 1"}]


def test_a_nan_loss_on_one_rank_stops_every_rank_at_the_optimizer_step_not_before_backward():
    weight = torch.nn.Parameter(torch.zeros(2))
    weight.grad = torch.ones(2)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    guard = NonFiniteGuard(action="stop")
    bad = _TwoRanks(rank=1, other=0)
    guard.on_before_backward(bad, None, torch.tensor(float("nan")))  # the others are in backward
    with pytest.raises(NonFiniteLoss, match="loss is nan"):
        guard.on_before_optimizer_step(bad, None, optimizer)
    assert bad.sent == [1]  # world_size - rank
    other = _TwoRanks(rank=0, other=1)
    with pytest.raises(NonFiniteLoss, match="not finite on rank 1"):
        NonFiniteGuard(action="stop").on_before_optimizer_step(other, None, optimizer)
    clean = _TwoRanks(rank=0, other=0)
    NonFiniteGuard(action="stop").on_before_optimizer_step(clean, None, optimizer)
    assert clean.sent == [0] and weight.grad is not None


class AdamRegressor(Regressor):
    def __init__(self, fused: bool, nan_at: int | None = None) -> None:
        super().__init__(nan_at=nan_at)
        self.fused = fused

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr, fused=self.fused)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "not fused"])
def test_skip_under_16_mixed_lets_the_scaler_skip_the_step_and_lower_its_scale(fused):
    """16-mixed on CPU (Lightning's plugin with torch's CPU GradScaler) stands in for CUDA: with a
    fused AdamW the scaler checks the gradients inside its step, after the guard's hook."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    pl.seed_everything(0)
    model = AdamRegressor(fused=fused, nan_at=3)
    scaler = torch.amp.GradScaler("cpu")
    seen: dict[int, tuple] = {}

    class Watch(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            step = trainer.optimizers[0].state[pl_module.layer.weight].get("step", 0)
            seen[trainer.global_step] = (weights(pl_module), scaler.get_scale(), int(step))

    guard = NonFiniteGuard(action="skip")
    precision = MixedPrecision("16-mixed", device="cpu", scaler=scaler)
    with pytest.warns(UserWarning, match="loss is nan at step 2: step skipped"):
        quiet_trainer(max_steps=6, plugins=[precision], callbacks=[guard, Watch()]).fit(model)
    assert guard.skipped == [{"step": 2, "why": "loss is nan"}]
    (before, scale_before, adam_before), (after, scale_after, adam_after) = seen[2], seen[3]
    for a, b in zip(before, after):
        assert torch.equal(a, b)
    assert adam_after == adam_before  # AdamW's bias correction did not count the skipped step
    assert scale_after == scale_before / 2
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_rank_that_saw_nothing_skips_through_a_fused_optimizers_scaler():
    """Its own gradients are finite, so only the guard can tell the scaler to skip the step."""
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.AdamW([weight], lr=0.1, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(weight.sum()).backward()
    trainer = _TwoRanks(rank=0, other=1)
    trainer.precision_plugin = SimpleNamespace(scaler=scaler)
    with pytest.warns(UserWarning, match="not finite on rank 1"):
        NonFiniteGuard(action="skip").on_before_optimizer_step(trainer, None, optimizer)
    scaler.step(optimizer)
    scaler.update()
    assert torch.equal(weight.detach(), torch.ones(2))
    assert scaler.get_scale() == 512.0
