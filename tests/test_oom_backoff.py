"""OOMBackoff + ChunkedBackward: an injected OOM at step k, with each device's real message."""

from __future__ import annotations

from unittest.mock import Mock

import pytest
import torch
from lightning.pytorch import LightningDataModule, LightningModule, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from lightning.pytorch.plugins.precision import MixedPrecision
from torch import nn
from torch.utils.data import DataLoader, Dataset

from laptrain.callbacks.oom_backoff import OOMBackoff, is_oom
from laptrain.data.collate import batch_length
from laptrain.data.user_loaders import prepare_user_loaders
from laptrain.model.chunked_backward import ChunkedBackward, slice_batch
from tests.conftest import quiet_trainer
from tests.fakes import FakeProbe

# The texts each device raises (docs/hardware.md §7).
DEVICE_ERRORS = {
    "cuda": lambda: torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 7.79 GiB "
        "of which 1.02 GiB is free."
    ),
    "mps": lambda: RuntimeError(
        "MPS backend out of memory (MPS allocated: 17.86 GB, other allocations: 1.25 GB, max "
        "allowed: 18.13 GB). Tried to allocate 256.00 MB on private pool."
    ),
    "mps_buffer": lambda: RuntimeError("Invalid buffer size: 24.00 GB"),
    "cpu": lambda: RuntimeError(
        "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)"
    ),
}
BATCH = 8


class ChunkedModel(ChunkedBackward, BoringModel):
    """A two-layer BoringModel whose forward (or backward) fails above ``fits`` samples at step k."""

    def __init__(self, fail_step=None, fits=BATCH, error="mps", in_backward=False, fail_batch=None):
        super().__init__()
        self.layer = nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 2))
        self.fail_step, self.fail_batch, self.fits = fail_step, fail_batch, fits
        self.error, self.in_backward = error, in_backward
        self.samples_seen, self.batches, self._pending = 0, -1, 0

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 64), batch_size=BATCH)

    def training_step(self, batch, batch_idx):
        self.batches += 1
        return self.chunked_backward(batch, self.loss_of)

    def loss_of(self, chunk):
        at_k = self.global_step == self.fail_step or self.batches == self.fail_batch
        fail = at_k and len(chunk) > self.fits
        if fail and not self.in_backward:
            raise DEVICE_ERRORS[self.error]()
        hidden = self.layer[0](chunk)
        if fail:  # raised half-way through backward, after the last layer's grads were added
            hidden.register_hook(lambda grad: (_ for _ in ()).throw(DEVICE_ERRORS[self.error]()))
        self._pending = len(chunk)
        return self.loss(self.layer[2](self.layer[1](hidden)))

    def backward(self, loss, *args, **kwargs):
        super().backward(loss, *args, **kwargs)
        if loss.requires_grad:
            self.samples_seen += self._pending


class PlainModel(BoringModel):
    """The same network and data trained by Lightning's own backward (no chunks)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 2))

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 64), batch_size=BATCH)


def fit(model, backoff, steps, tmp_path, ckpt_path=None, callbacks=(), **kwargs):
    logger = Mock()
    logger.save_dir = str(tmp_path)
    trainer = quiet_trainer(
        accelerator="cpu",
        max_steps=steps,
        limit_val_batches=0,
        logger=logger,
        callbacks=[c for c in (backoff, *callbacks) if c],
        enable_checkpointing=bool(callbacks),
        default_root_dir=tmp_path,
        **kwargs,
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer, logger


def oom_calls(logger):
    calls = [
        (c.kwargs.get("step"), c.args[0] if c.args else c.kwargs["metrics"])
        for c in logger.log_metrics.call_args_list
    ]
    return [(s, m) for s, m in calls if any(k.startswith("oom/") for k in m)]


def trained(tmp_path, backoff=None, steps=6, trainer=None, **model_kwargs):
    seed_everything(3)
    model = ChunkedModel(**model_kwargs)
    fitted, logger = fit(model, backoff, steps, tmp_path, **(trainer or {}))
    return model, fitted, logger


@pytest.mark.parametrize(("accumulate", "batches"), [(1, 5), (3, 14)])  # windows 3+3+2 per epoch
def test_chunked_steps_train_exactly_like_lightnings_own_backward(tmp_path, accumulate, batches):
    seed_everything(3)
    plain = PlainModel()
    initial = {k: v.clone() for k, v in plain.state_dict().items()}
    fit(plain, None, 5, tmp_path, accumulate_grad_batches=accumulate)
    chunked, _, _ = trained(
        tmp_path,
        OOMBackoff(probe=FakeProbe()),
        steps=5,
        fail_step=0,
        fits=2,
        trainer={"accumulate_grad_batches": accumulate},
    )
    assert chunked.samples_seen == batches * BATCH
    for name, value in plain.state_dict().items():
        assert not torch.equal(value, initial[name])  # it did train
        torch.testing.assert_close(chunked.state_dict()[name], value)


@pytest.mark.parametrize("error", sorted(DEVICE_ERRORS))
def test_every_device_oom_is_recognised(error):
    assert is_oom(DEVICE_ERRORS[error]())


def test_other_errors_are_not_ooms():
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_oom(ValueError("out of memory"))  # only RuntimeError carries the allocator text


@pytest.mark.parametrize("error", sorted(DEVICE_ERRORS))
def test_injected_oom_at_step_k_changes_nothing_but_the_micro_batch(tmp_path, error):
    reference, ref_trainer, _ = trained(tmp_path)
    probe = FakeProbe(kind="mps")
    backoff = OOMBackoff(every_n_steps=1, probe=probe)
    model, trainer, logger = trained(tmp_path, backoff, fail_step=2, fits=3, error=error)

    assert trainer.global_step == ref_trainer.global_step == 6  # no step lost or repeated
    assert model.samples_seen == reference.samples_seen == 6 * BATCH  # none skipped or doubled
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value)
    assert [e["from"] for e in backoff.events] == [8, 4] and backoff.micro_batch == 2
    assert probe.calls.count("empty_cache") == 2
    logged = oom_calls(logger)
    assert [s for s, _ in logged] == [1, 2, 3, 4, 5, 6]
    assert {m["oom/effective_batch"] for _, m in logged} == {8.0}
    # the third optimizer step (global_step 2 while it runs) is logged at step 3
    assert [m["oom/micro_batch"] for _, m in logged] == [8.0, 8.0, 2.0, 2.0, 2.0, 2.0]
    assert [m["oom/accumulation"] for _, m in logged] == [1.0, 1.0, 4.0, 4.0, 4.0, 4.0]
    assert [m["oom/backoffs"] for _, m in logged] == [0.0, 0.0, 2.0, 2.0, 2.0, 2.0]


def test_oom_half_way_through_backward_leaves_no_partial_gradient(tmp_path):
    trainer_kwargs = {"accumulate_grad_batches": 2}
    reference, _, _ = trained(tmp_path, steps=4, trainer=trainer_kwargs)
    backoff = OOMBackoff(probe=FakeProbe())
    # batch 3 is the second of its accumulation window: gradients of batch 2 are already held
    model, trainer, _ = trained(
        tmp_path, backoff, steps=4, fail_batch=3, fits=4, in_backward=True, trainer=trainer_kwargs
    )
    assert trainer.global_step == 4 and backoff.micro_batch == 4
    assert model.samples_seen == reference.samples_seen == 4 * 2 * BATCH
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value)


def test_gradscaler_precision_plugin_still_applies(tmp_path):
    def plugin():
        return {"plugins": [MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))]}

    reference, _, _ = trained(tmp_path, steps=3, trainer=plugin())
    model, trainer, _ = trained(
        tmp_path, OOMBackoff(probe=FakeProbe()), steps=3, fail_step=1, fits=4, trainer=plugin()
    )
    assert trainer.global_step == 3 and model.samples_seen == reference.samples_seen
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, atol=1e-3, rtol=1e-3)


def test_gives_up_at_micro_batch_one_naming_what_to_change(tmp_path):
    with pytest.raises(RuntimeError, match="micro-batch 1; one sample does not fit: shorten"):
        trained(tmp_path, OOMBackoff(probe=FakeProbe()), fail_step=0, fits=0)


def test_other_errors_and_disabled_backoff_propagate(tmp_path):
    with pytest.raises(RuntimeError, match="MPS backend out of memory"):
        trained(tmp_path, OOMBackoff(enabled=False, probe=FakeProbe()), fail_step=0, fits=3)
    with pytest.raises(RuntimeError, match="MPS backend out of memory"):
        trained(tmp_path, None, fail_step=0, fits=3)


def test_micro_batch_survives_a_resume(tmp_path):
    seed_everything(3)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=1)
    first = OOMBackoff(every_n_steps=1, probe=FakeProbe())
    fit(ChunkedModel(fail_step=1, fits=5), first, 3, tmp_path, callbacks=[checkpoint])
    assert first.micro_batch == 4

    resumed = OOMBackoff(every_n_steps=1, probe=FakeProbe())
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=1)
    trainer, logger = fit(
        ChunkedModel(),
        resumed,
        5,
        tmp_path,
        ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"),
        callbacks=[checkpoint],
    )
    assert trainer.global_step == 5 and resumed.micro_batch == 4
    assert resumed.events == first.events and len(resumed.events) == 1
    assert [m["oom/micro_batch"] for _, m in oom_calls(logger)] == [4.0, 4.0]


def test_a_module_without_chunked_backward_gets_no_console_line_and_no_warning(
    tmp_path, caplog, recwarn
):
    """Before (issue 35, item 7): a UserWarning with a source path on every run of such a module;
    then (issue 48, item 3) a console line on every run saying the backoff did not apply."""
    trainer = quiet_trainer(
        accelerator="cpu",
        max_steps=3,
        limit_val_batches=0,
        logger=Mock(),
        callbacks=[OOMBackoff(probe=FakeProbe())],
        default_root_dir=tmp_path,
    )
    with caplog.at_level("INFO"):
        trainer.fit(BoringModel())
    assert not [w for w in recwarn if "oom_backoff" in str(w.message)]
    assert not [r for r in caplog.records if "oom_backoff" in r.getMessage()]


def test_slicing_keeps_per_sample_fields_and_shared_ones():
    batch = {
        "input_ids": torch.arange(12).view(4, 3),
        "labels": torch.tensor([0, 1, 0, 1]),
        "texts": ["a", "b", "c", "d"],
        "scale": torch.tensor(2.0),
    }
    assert batch_length(batch) == 4
    part = slice_batch(batch, 1, 3)
    assert part["input_ids"].tolist() == [[3, 4, 5], [6, 7, 8]]
    assert part["labels"].tolist() == [1, 0] and part["texts"] == ["b", "c"]
    assert part["scale"] is batch["scale"]
    x, y = slice_batch((torch.zeros(4, 2), torch.ones(4)), 0, 1)
    assert x.shape == (1, 2) and y.shape == (1,)


def test_bad_value_names_the_config_key():
    with pytest.raises(ValueError, match="oom_backoff.every_n_steps"):
        OOMBackoff(every_n_steps=0)


class Rows(Dataset):
    """64 rows of 32 features and their index."""

    def __init__(self):
        self.x = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], i


class RowsData(LightningDataModule):
    def train_dataloader(self):
        return DataLoader(Rows(), batch_size=BATCH, shuffle=True)


class UserModel(LightningModule):
    """A module with Lightning's own backward; an OOM for more than ``fits`` rows at ``fail_step``."""

    def __init__(self, fail_step=None, fits=BATCH // 2, error="cuda"):
        super().__init__()
        self.layer = nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 2))
        self.fail_step, self.fits, self.error = fail_step, fits, error
        self.rows = []

    def training_step(self, batch, batch_idx):
        x, index = batch
        if self.global_step == self.fail_step and len(x) > self.fits:
            raise DEVICE_ERRORS[self.error]()
        self.rows.append(index.tolist())
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit_plain(tmp_path, fail_step=None, accumulate=1, epochs=2, max_steps=-1, ckpt_path=None):
    seed_everything(0)
    model, data = UserModel(fail_step), RowsData()
    prepare_user_loaders(data, None)  # as the job does: the loader rebuilt as a resumable one
    backoff = OOMBackoff(probe=FakeProbe())
    saves = ModelCheckpoint(tmp_path, save_last=True, every_n_train_steps=1, save_top_k=0)
    trainer = quiet_trainer(
        accelerator="cpu",
        max_epochs=epochs,
        max_steps=max_steps,
        accumulate_grad_batches=accumulate,
        limit_val_batches=0,
        callbacks=[backoff, saves],
        enable_checkpointing=True,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return trainer, backoff, model


@pytest.mark.parametrize(("accumulate", "fail_step"), [(1, 2), (2, 1), (2, 5)])
def test_a_plain_module_s_oom_cuts_the_loader_batch_and_trains_like_an_uninterrupted_run(
    tmp_path, accumulate, fail_step
):
    """Before: the OOM ended the run. Now the interrupted optimizer step starts over on batches of
    4 accumulated twice as often: the same steps, the same samples in the same order, the same
    weights; ``fail_step=1`` with accumulation 2 fails on a step's second batch, whose first is
    undone and redone; ``fail_step=5`` is in the second epoch."""
    whole_trainer, _, whole = fit_plain(tmp_path / "whole", None, accumulate)
    trainer, backoff, cut = fit_plain(tmp_path / "cut", fail_step, accumulate)
    assert trainer.global_step == whole_trainer.global_step == 2 * 64 // (BATCH * accumulate)
    for a, b in zip(whole.parameters(), cut.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert [e["from"] for e in backoff.events] == [BATCH] and backoff.micro_batch == BATCH // 2
    assert trainer.accumulate_grad_batches == 2 * accumulate
    epoch = 64 // BATCH
    rows = [r for batch in cut.rows for r in batch]
    # every row once an epoch (the undone half-step's rows were drawn once more, then redone)
    done = [i for b in whole.rows for i in b]
    assert sorted(done[:64]) == sorted(done[64:]) == list(range(64))
    assert rows[-len(done) // 2 :] != [] and len(whole.rows) == 2 * epoch


def test_a_plain_module_whose_loader_cannot_be_cut_says_so_once_in_the_report(tmp_path, caplog):
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            g = torch.Generator().manual_seed(0)
            return iter([(torch.randn(32, generator=g), i) for i in range(64)])

    class StreamData(LightningDataModule):
        def train_dataloader(self):
            return DataLoader(Stream(), batch_size=BATCH)

    data = StreamData()
    prepare_user_loaders(data, None)
    backoff = OOMBackoff(probe=FakeProbe())
    trainer = quiet_trainer(
        accelerator="cpu",
        max_steps=2,
        limit_val_batches=0,
        callbacks=[backoff],
        default_root_dir=tmp_path,
    )
    with caplog.at_level("INFO"):
        trainer.fit(UserModel(), datamodule=data)
    assert backoff.summary()["not_applied"] == (
        "its train loader is not one laptrain rebuilt (an IterableDataset, or a sampler of its "
        "own), so it cannot be cut mid-epoch: an out-of-memory error ends the run"
    )
    assert not [r for r in caplog.records if "oom_backoff" in r.getMessage()]


def test_a_run_resumed_after_a_plain_module_s_backoff_keeps_the_small_batch_and_its_position(
    tmp_path,
):
    """Stopped at step 5, mid-epoch on batches of 4 (an OOM at step 2 cut them from 8), and
    resumed: the checkpoint's batch counters and loader position are in batches of 4, and the run
    ends with the weights of one never stopped."""
    _, _, whole = fit_plain(tmp_path / "whole", 2)
    fit_plain(tmp_path / "cut", 2, max_steps=5)
    trainer, backoff, resumed = fit_plain(
        tmp_path / "cut", ckpt_path=tmp_path / "cut" / "last.ckpt"
    )
    assert backoff.micro_batch == BATCH // 2 and trainer.accumulate_grad_batches == 2
    assert trainer.global_step == 16 and len(resumed.rows) == 2 * (16 - 5)
    for a, b in zip(whole.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
