"""The measured preflight (laptrain.preflight.measured): any LightningModule's batch sized by real
training steps on its own rows, read from the device's counter; the run itself is not changed."""

from __future__ import annotations

import random
import time
from pathlib import Path

import lightning.pytorch as pl
import numpy
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from laptrain.job.plan import build_run_plan
from laptrain.launch.device import RunDevice
from laptrain.preflight import measured
from laptrain.preflight.batch import PreflightError
from laptrain.preflight.measured import (
    SETTLED_STEPS,
    BatchSearch,
    NotMeasured,
    Trial,
    measured_plan,
)
from laptrain.preflight.peak_memory import CudaPeak, KernelPeakRss, SampledRss
from laptrain.preflight.request import PlannedRun, PlanRequest
from tests.conftest import compose_train, quiet_trainer
from tests.test_plan import launched
from tests.test_user_errors import train_user

GiB = 1024**3
MB = 1024**2
batches_run: list[int] = []  # batch sizes the modules' training steps ran, in order


class Tiny(pl.LightningModule):
    """A user's module: dropout (draws from the RNG), a step counter attribute, Adam."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.5), nn.Linear(16, 2))
        self.steps_run = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        batches_run.append(len(x))
        self.steps_run += 1
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.1)


class TemplateOptimizer(Tiny):
    """lightning-hydra-template's way: the parameters of ``self.trainer.model``."""

    def configure_optimizers(self):
        return {"optimizer": torch.optim.SGD(self.trainer.model.parameters(), lr=0.1)}


class ByHand(Tiny):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


class Rows(pl.LightningDataModule):
    """lightning-hydra-template style: hparams, loaders built with self.hparams.batch_size."""

    def __init__(self, rows: int = 256, batch_size: int | None = 8) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(1)
        self.train_set = TensorDataset(
            torch.randn(self.hparams.rows, 4, generator=g),
            torch.randint(0, 2, (self.hparams.rows,), generator=g),
        )

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)


class RowsCounter:
    """An injected memory reader: the peak of a window is ``base`` plus ``per_row`` per row of
    the batch the module trained on (its largest since the window opened), ``growth`` more once
    more than 2 steps ran, plus the copy of the module the measurer takes off on CPU."""

    kind = "cpu"

    def __init__(self, copy_bytes: float, base: float, per_row: float, growth: float = 0.0):
        self.copy_bytes, self.base, self.per_row, self.growth = copy_bytes, base, per_row, growth
        self.mark = 0
        self.resets = 0

    def level(self) -> float:
        return self.base + self.copy_bytes

    def reset(self) -> None:
        self.mark = len(batches_run)
        self.resets += 1

    def note(self) -> None:
        pass

    def peak(self) -> float:
        window = batches_run[self.mark :]
        rows = max(window, default=0) * self.per_row
        return self.base + self.copy_bytes + rows * (1 + (self.growth if len(window) > 2 else 0))


def copy_bytes(model: nn.Module) -> float:
    return float(sum(p.numel() * p.element_size() for p in model.parameters()))


CPU = RunDevice("cpu", "32-true", None, ())


def hardware(batch: int | str = "auto", budget_gb: float = 1.0, **kw) -> PlanRequest:
    fixed = {} if batch == "auto" else {"auto": False, "size": batch}
    return PlanRequest(memory_budget_gb=budget_gb, **fixed, **kw)


def data(rows: int = 256) -> Rows:
    dm = Rows(rows)
    dm.setup("fit")
    return dm


# --- the search, with an injected reader -------------------------------------------------------


def test_the_search_doubles_then_bisects_and_never_runs_a_batch_the_line_puts_over_the_budget():
    ran = []

    def measure(batch: int, steps: int) -> Trial:
        ran.append(batch)
        return Trial(batch, 100.0 + 10.0 * batch)

    search = BatchSearch(measure, budget=100.0 + 10.0 * 300)
    fit = search.largest_fit(4096)
    assert 300 - 300 * measured.RESOLUTION <= fit <= 300  # the largest that fits, within 1/32
    assert search.trials[fit].peak <= search.budget and search.trials[fit].ran
    assert ran[:9] == [1, 2, 4, 8, 16, 32, 64, 128, 256]  # doubling
    assert max(ran) <= 300  # 512, 384, 320 ... were predicted over the budget, not run
    assert {512, 384, 320} <= {b for b, t in search.trials.items() if not t.ran}


def test_the_search_answers_0_when_batch_1_does_not_fit_and_the_cap_when_everything_does():
    search = BatchSearch(lambda b, s: Trial(b, 10.0 * b), budget=5.0)
    assert search.largest_fit(64) == 0
    search = BatchSearch(lambda b, s: Trial(b, 10.0 * b), budget=1e9)
    assert search.largest_fit(100) == 100


def test_a_settled_peak_over_the_budget_lowers_the_batch_by_the_same_margin():
    # short runs read 100 + 10 b; eight steps read 20 % more: the pick must be lowered
    def measure(batch: int, steps: int) -> Trial:
        return Trial(batch, (100.0 + 10.0 * batch) * (1.2 if steps == SETTLED_STEPS else 1.0))

    search = BatchSearch(measure, budget=1100.0)
    fit = search.largest_fit(256)
    assert search.settle(fit).peak > search.budget
    lower = search.lower(fit)
    assert 0 < lower < fit and search.settle(lower).peak <= search.budget


# --- the measured plan of a module ---------------------------------------------------------------


def test_auto_picks_the_largest_batch_whose_measured_peak_fits_and_records_it():
    batches_run.clear()
    model, dm = Tiny(), data()
    counter = RowsCounter(copy_bytes(model), base=0.5 * GiB, per_row=1 * MB)
    plan = measured_plan(model, dm, hardware(budget_gb=0.6, max_batch=256), CPU, counter=counter)
    # 0.5 GiB + b MiB <= 0.6 GiB: b <= 102
    assert 102 - 102 * measured.RESOLUTION <= plan.micro_batch <= 102
    assert plan.estimate.total <= plan.budget.bytes == 0.6 * GiB
    assert plan.estimate.total == pytest.approx(0.5 * GiB + plan.micro_batch * MB)
    assert max(batches_run) <= 102  # no batch over the budget ran
    assert batches_run[-SETTLED_STEPS:] == [plan.micro_batch] * SETTLED_STEPS  # the pick, settled
    text = "\n".join(plan.summary_lines())
    assert f"at micro batch {plan.micro_batch} (" in text and "tokens" not in text
    assert "preflight: measured: 2 training steps of a copy of the module" in text


def test_measuring_leaves_the_module_the_rng_and_the_training_as_they_were():
    """The exact-resume promise: a run that measured first trains exactly as one that did not."""

    def trained(measure_first: bool) -> dict[str, torch.Tensor]:
        pl.seed_everything(3)
        model, dm = Tiny(), Rows(64, batch_size=16)
        dm.setup("fit")
        if measure_first:
            before = {k: v.clone() for k, v in model.state_dict().items()}
            rng = (torch.get_rng_state(), random.getstate(), numpy.random.get_state()[1].copy())
            counter = RowsCounter(copy_bytes(model), base=0.1 * GiB, per_row=1 * MB)
            measured_plan(model, dm, hardware(16), CPU, counter=counter)
            after = model.state_dict()
            assert all(torch.equal(before[k], after[k]) for k in before)
            assert all(p.grad is None for p in model.parameters()) and model.steps_run == 0
            assert torch.equal(rng[0], torch.get_rng_state()) and rng[1] == random.getstate()
            assert numpy.array_equal(rng[2], numpy.random.get_state()[1])
        quiet_trainer(max_steps=3, limit_val_batches=0).fit(model, dm)
        return model.state_dict()

    plain, measured_first = trained(False), trained(True)
    assert all(torch.equal(plain[k], measured_first[k]) for k in plain)


def test_a_fixed_batch_far_over_the_budget_is_refused_in_one_line_without_running_it():
    batches_run.clear()
    model, dm = Tiny(), data()
    counter = RowsCounter(copy_bytes(model), base=0.5 * GiB, per_row=1 * MB)
    with pytest.raises(PreflightError) as refused:
        measured_plan(model, dm, hardware(200, 0.6, option="data.batch_size"), CPU, counter=counter)
    message = str(refused.value)
    assert message.startswith("data.batch_size=200 does not fit: predicted from the smaller")
    assert "\n" not in message and "hardware.batch_size=auto" in message
    assert 200 not in batches_run


def test_a_fixed_batch_that_fits_is_kept_and_settled():
    batches_run.clear()
    model, dm = Tiny(), data()
    counter = RowsCounter(copy_bytes(model), base=0.5 * GiB, per_row=1 * MB)
    plan = measured_plan(model, dm, hardware(32, 0.6), CPU, counter=counter)
    assert plan.micro_batch == 32 and plan.requested_batch == 32
    assert batches_run == [1, 1, 2, 2, *[32] * (2 + SETTLED_STEPS)]


@pytest.mark.slow  # ~7 s of real measuring; the plan test above covers the common path
def test_a_template_style_configure_optimizers_reading_self_trainer_is_measured():
    model, dm = TemplateOptimizer(), data()
    counter = RowsCounter(copy_bytes(model), base=0.5 * GiB, per_row=1 * MB)
    plan = measured_plan(model, dm, hardware(budget_gb=0.55), CPU, counter=counter)
    assert 0 < plan.micro_batch <= 51
    assert model._trainer is None  # the stand-in was given to the copy only


class OneCycle(Tiny):
    """Lightning's docs' scheduler: OneCycleLR over the Trainer's estimated stepping batches."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=0.1, total_steps=self.trainer.estimated_stepping_batches
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


class ReadsProfiler(Tiny):
    """A module reading something of its Trainer that exists only once the Trainer does."""

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=0.1)
        every = self.trainer.check_val_every_n_epoch
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=every)
        return [optimizer], [scheduler]


def test_a_one_cycle_scheduler_over_the_estimated_stepping_batches_is_measured():
    batches_run.clear()
    model, dm = OneCycle(), data()
    counter = RowsCounter(copy_bytes(model), base=0.5 * GiB, per_row=1 * MB)
    length = PlannedRun(max_epochs=3, accumulation=2)
    plan = measured_plan(model, dm, hardware(budget_gb=0.6, run=length), CPU, counter=counter)
    assert 0 < plan.micro_batch <= 102
    assert not any("without the learning-rate scheduler" in note for note in plan.notes)


def test_the_stand_in_says_what_lightnings_trainer_says_of_the_run():
    class Records(OneCycle):
        def configure_optimizers(self):
            trainer = self.trainer
            self.said = (trainer.estimated_stepping_batches, trainer.max_epochs, trainer.max_steps)
            return super().configure_optimizers()

    model, dm = Records(), Rows(64, batch_size=8)  # 8 batches an epoch
    quiet_trainer(max_epochs=3, accumulate_grad_batches=2, limit_val_batches=0).fit(model, dm)
    said_by_lightning = model.said
    model._trainer = measured.stand_in(PlannedRun(max_epochs=3, accumulation=2), model, dm, 8)
    model.configure_optimizers()
    assert model.said == said_by_lightning == (12, 3, -1)
    assert measured.stand_in(PlannedRun(), model, dm, 8).max_epochs == 1000  # Lightning's default


def test_a_trainer_property_the_stand_in_cannot_answer_measures_without_the_scheduler():
    model, dm = ReadsProfiler(), data()
    counter = RowsCounter(copy_bytes(model), base=0.5 * GiB, per_row=1 * MB)
    plan = measured_plan(model, dm, hardware(budget_gb=0.6), CPU, counter=counter)
    assert 0 < plan.micro_batch <= 102
    assert (
        "measured without the learning-rate scheduler: configure_optimizers() reads "
        "trainer.check_val_every_n_epoch" in "\n".join(plan.summary_lines())
    )


class Wide(Tiny):
    """Weights, gradients and Adam's two states of 4.2 MiB each; a step's rows are tiny."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 2))


def wide_counter(model: nn.Module) -> RowsCounter:
    """The whole model state (4 x its weights) plus 1 MiB, and 1 KiB a row."""
    return RowsCounter(copy_bytes(model), base=4 * copy_bytes(model) + MB, per_row=1024)


def test_under_fsdp_each_rank_is_sized_by_its_share_of_the_model_state():
    model = Wide()
    weights = copy_bytes(model)
    with pytest.raises(PreflightError, match="does not fit even at micro batch 1"):
        measured_plan(model, data(), hardware(budget_gb=8 / 1024), CPU, counter=wide_counter(model))
    sharded = hardware(budget_gb=8 / 1024, run=PlannedRun(devices=4, sharded=True))
    plan = measured_plan(model, data(), sharded, CPU, counter=wide_counter(model))
    assert plan.micro_batch > 1 and plan.estimate.total <= plan.budget.bytes
    assert plan.estimate.weights == pytest.approx(weights / 4)
    assert "per rank of 4: 1/N of the model state (FSDP)" in plan.notes


def test_under_ddp_each_rank_counts_the_gradient_buckets():
    model = Wide()
    budget = hardware(budget_gb=20 / 1024)
    alone = measured_plan(model, data(), budget, CPU, counter=wide_counter(model))
    assert alone.micro_batch > 1
    with pytest.raises(PreflightError, match="does not fit even at micro batch 1"):
        ddp = hardware(budget_gb=20 / 1024, run=PlannedRun(devices=2))
        measured_plan(model, data(), ddp, CPU, counter=wide_counter(model))


def test_running_out_of_memory_moving_the_copy_is_the_one_line_refusal(monkeypatch):
    def out_of_memory(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    model = Tiny()
    monkeypatch.setattr(Tiny, "to", out_of_memory)
    with pytest.raises(PreflightError) as refused:
        measured_plan(model, data(), hardware(8), CPU, counter=RowsCounter(0, 0, 0))
    message = str(refused.value)
    assert message.startswith("this job does not fit even at micro batch 1: a copy of the module")
    assert "\n" not in message


def test_the_cuda_counter_reads_reserved_memory_which_the_free_memory_budget_counts(monkeypatch):
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "synchronize", lambda index=None: None)
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda index=None: 5 * GiB)
    monkeypatch.setattr(cuda, "max_memory_reserved", lambda index=None: 7 * GiB)
    monkeypatch.setattr(cuda, "memory_allocated", lambda index=None: 1 * GiB)
    monkeypatch.setattr(cuda, "memory_reserved", lambda index=None: 2 * GiB)
    counter = CudaPeak(0)
    assert (counter.level(), counter.peak()) == (2 * GiB, 7 * GiB)


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (ByHand(), "optimizes by hand"),
        (nn.Linear(4, 2), "Linear is not a LightningModule"),
    ],
)
def test_what_cannot_be_measured_says_why_in_one_line(model, reason):
    with pytest.raises(NotMeasured, match=reason) as refused:
        measured_plan(model, data(), hardware(8), CPU, counter=RowsCounter(0, 0, 0))
    assert "\n" not in str(refused.value)


def test_a_datamodule_whose_loader_fails_is_not_measured_and_says_so():
    class Broken(Rows):
        def train_dataloader(self):
            raise RuntimeError("no rows\nhere")

    with pytest.raises(
        NotMeasured, match="train_dataloader\\(\\) failed \\(RuntimeError: no rows here\\)"
    ):
        measured_plan(Tiny(), Broken(), hardware(8), CPU, counter=RowsCounter(0, 0, 0))


# --- through the run plan ----------------------------------------------------------------------


def test_the_run_plan_takes_the_measured_batch_for_a_user_module(tmp_path, monkeypatch):
    model, dm = Tiny(), data()
    counter = RowsCounter(copy_bytes(model), base=0.5 * GiB, per_row=1 * MB)
    monkeypatch.setattr(measured, "counter_for", lambda kind, index=None: counter)
    overrides = ["hardware=cpu", "hardware.batch_size=auto", "hardware.memory_budget_gb=0.6"]
    cfg = compose_train([*overrides, "data.batch_size=from_profile"], tmp_path)
    plan = build_run_plan(cfg, model, dm, launched(cfg), tmp_path, tmp_path)
    assert 99 <= plan.loader_batch <= 102 and plan.micro_batch == plan.loader_batch
    assert "largest that fits the memory budget" in plan.reasons["batch"]
    assert any(line.startswith("preflight: measured:") for line in plan.memory["lines"])
    assert (tmp_path / "preflight.json").is_file()  # what a resumed session and other ranks read


def test_a_fixed_batch_on_a_module_that_cannot_be_measured_trains_and_says_why(tmp_path):
    cfg = compose_train(["hardware=cpu", "hardware.batch_size=8"], tmp_path)
    plan = build_run_plan(cfg, ByHand(), data(), launched(cfg), tmp_path, tmp_path)
    assert plan.loader_batch == 8
    line = next(x for x in plan.summary_lines() if x.startswith("memory:"))
    assert line.startswith("memory: not estimated: the module optimizes by hand")


# --- the counters ------------------------------------------------------------------------------


def _hold(megabytes: int) -> None:
    block = torch.ones(megabytes * MB // 4)
    time.sleep(0.05)
    del block


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux /proc only")
def test_the_kernel_counter_sees_a_freed_block_and_forgets_it_after_a_reset():
    counter = KernelPeakRss()
    counter.reset()
    _hold(200)
    assert counter.peak() - counter.level() > 150 * MB
    counter.reset()
    assert counter.peak() - counter.level() < 50 * MB


def test_the_sampling_counter_sees_a_freed_block():
    counter = SampledRss()
    counter.reset()
    _hold(200)
    assert counter.peak() - counter.level() > 150 * MB


# --- through train.py --------------------------------------------------------------------------

USER_MODULE = """
import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class MLP(pl.LightningModule):
    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))

    def _step(self, batch, stage):
        x, y = batch
        logits = self.net(x)
        loss = nn.functional.cross_entropy(logits, y)
        self.log(f"{stage}/loss", loss)
        self.log(f"{stage}/acc", (logits.argmax(-1) == y).float().mean())
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class Blobs(pl.LightningDataModule):
    def __init__(self, rows: int = 300, batch_size: int = 32):
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(0)
        y = torch.randint(0, 3, (self.hparams.rows,), generator=g)
        x = torch.randn(self.hparams.rows, 8, generator=g) + 2 * y[:, None].float()
        cut, end = self.hparams.rows * 8 // 10, self.hparams.rows * 9 // 10
        self.train_set = TensorDataset(x[:cut], y[:cut])
        self.val_set = TensorDataset(x[cut:end], y[cut:end])
        self.test_set = TensorDataset(x[end:], y[end:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.hparams.batch_size)
"""


def user_project(folder: Path) -> list[str]:
    """A user's project outside src/laptrain; the train.py overrides that find it."""
    (folder / "conf" / "model").mkdir(parents=True)
    (folder / "conf" / "data").mkdir(parents=True)
    (folder / "measured_task.py").write_text(USER_MODULE)
    (folder / "conf" / "model" / "measured_mlp.yaml").write_text("_target_: measured_task.MLP\n")
    (folder / "conf" / "data" / "measured_blobs.yaml").write_text(
        "_target_: measured_task.Blobs\nrows: 300\nbatch_size: 32\n"
    )
    return [
        f"hydra.searchpath=[file://{folder / 'conf'}]",
        "model=measured_mlp",
        "data=measured_blobs",
        "hardware=cpu",
        "logger=none",
    ]


@pytest.mark.slow  # ~17 s; the plan's measured batch is tested in process, and
# test_user_batch runs hardware.batch_size=auto on a user project
def test_train_py_trains_a_user_module_at_the_batch_the_preflight_measured(tmp_path, monkeypatch):
    """In this process (train_user: ``tmp_path`` on sys.path as PYTHONPATH puts it): on CPU the
    budget counts the whole process, this one's memory too, as it counts the peak."""
    args = user_project(tmp_path)
    done = train_user(
        [
            *args,
            "data.batch_size=from_profile",
            "hardware.batch_size=auto",
            "preflight.max_batch_size=64",
            "trainer.max_epochs=1",
            "run_name=auto",
        ],
        tmp_path,
        tmp_path,
        monkeypatch,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    # 240 training rows, a budget of GiBs: every batch fits up to the cap of 64
    assert "micro batch size: 64 (batch_size auto: the largest that fits the memory budget" in out
    assert "preflight: measured: 2 training steps of a copy of the module" in out
    assert "preflight: estimate " in out and "at micro batch 64 (" in out
    ckpt = torch.load(
        tmp_path / "outputs" / "auto" / "checkpoints" / "last.ckpt", weights_only=False
    )
    assert ckpt["global_step"] == 4  # one epoch of 240 rows at 64 a batch

    small = train_user(
        [*args, "hardware.batch_size=auto", "data.batch_size=from_profile"]
        + ["hardware.memory_budget_gb=0.01", "run_name=small"],
        tmp_path,
        tmp_path,
        monkeypatch,
    )
    from laptrain.exit_codes import DOES_NOT_FIT_EXIT

    assert small.returncode == DOES_NOT_FIT_EXIT == 69
    error = small.stderr.strip().splitlines()[-1]
    assert error.startswith("error: this job does not fit even at micro batch 1: measured peak")
    assert "hardware.memory_budget_gb" in error
