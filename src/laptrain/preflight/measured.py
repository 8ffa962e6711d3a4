"""The memory preflight of any LightningModule: measured, where batch.py estimates
(docs/preflight_any_module.md has what it runs, how it searches, the counters and the accuracy).

Real steps of the module's own ``training_step`` and optimizers on real rows at growing batches,
read by the device's counter (peak_memory.py): doubling, then bisecting, never waiting for an OOM
(on a Mac a batch that swaps is slow, not refused: docs/hardware.md §1). The run is not changed:
a deep copy trains, rows come from a new seeded loader, the RNG states are put back.
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, default_collate, default_convert

from laptrain.hardware.probe import TorchProbe
from laptrain.model.contracts import ChunksBatches
from laptrain.preflight.batch import BatchDecision, PreflightError, decision
from laptrain.preflight.budget import Budget, device_budget
from laptrain.preflight.estimate import Estimate, GiB
from laptrain.preflight.peak_memory import PeakCounter, counter_for, release_freed
from laptrain.preflight.request import PlannedRun, PlanRequest, kept_note
from laptrain.preflight.worker_memory import WorkerCost

if TYPE_CHECKING:
    from laptrain.hardware.run_device import RunDevice

# Steps per batch tried while searching: the second runs with the optimizer state the first made.
STEPS_PER_TRIAL = 2
# Steps run at the batch picked. On glibc the process's peak still grows over the first steps of a
# run at one batch (freed blocks the heap keeps, docs/hardware.md §9b): measured at 12-16 steps of a
# real fit, a small CNN reached its peak at step 7 (0.957 GB after step 1, 0.963 after 2, 1.025
# from 7) and a TransformerEncoder at step 4 (0.960, 1.039, 1.070); docs/preflight_any_module.md.
SETTLED_STEPS = 8
# The search stops bisecting once the batches that fit and that do not are this close (a fraction
# of the one that fits): peaks of neighbouring batches differ by less than the allocator's noise.
RESOLUTION = 1 / 32
# How often a settled peak over the budget may lower the batch before the job is refused.
LOWERINGS = 3
TRUE_DTYPES = {"bf16-true": torch.bfloat16, "16-true": torch.float16, "64-true": torch.float64}
ROWS_SEED = 0


class NotMeasured(ValueError):
    """The module or its data cannot be measured; the message says why, in one line."""


@dataclass(frozen=True)
class Trial:
    """One batch size tried: the run's peak there (bytes), and how far memory rose in its steps
    (``rise``, the gradients and activations); ``ran`` False: predicted over the budget, not run."""

    batch: int
    peak: float
    rise: float = 0.0
    ran: bool = True
    steps: int = STEPS_PER_TRIAL


Measure = Callable[[int, int], Trial]  # (batch, steps) -> the run's peak at that batch


class BatchSearch:
    """Which batches fit ``budget`` bytes, running ``measure(batch, steps)`` only where worth it."""

    def __init__(self, measure: Measure, budget: float) -> None:
        self.measure, self.budget = measure, budget
        self.trials: dict[int, Trial] = {}
        self.settled: dict[int, Trial] = {}
        self.smallest = 1  # 2 where a step cannot run on one row (BatchNorm in training)

    def predicted(self, batch: int) -> float | None:
        """The peak at ``batch`` on the line through the largest measured batch below it and one at
        most half as large (small batches differ more by allocator noise); None with fewer than
        two."""
        below = sorted(b for b, t in self.trials.items() if t.ran and b < batch)
        if len(below) < 2:
            return None
        top = below[-1]
        base = max((b for b in below if 2 * b <= top), default=below[0])
        low, high = self.trials[base], self.trials[top]
        slope = max(0.0, (high.peak - low.peak) / (high.batch - low.batch))
        return high.peak + slope * (batch - high.batch)

    def fits(self, batch: int) -> bool:
        """Whether ``batch`` fits: measured, unless it is above every batch measured and the line
        through the measured peaks puts it over the budget (then it counts as not fitting)."""
        if batch not in self.trials:
            guess = self.predicted(batch)
            top = max((b for b, t in self.trials.items() if t.ran), default=0)
            if batch > top and guess is not None and guess > self.budget:
                self.trials[batch] = Trial(batch, guess, ran=False, steps=0)
            else:
                self.trials[batch] = self.measure(batch, STEPS_PER_TRIAL)
        trial = self.trials[batch]
        return trial.ran and trial.peak <= self.budget

    def largest_fit(self, max_batch: int) -> int:
        """The largest batch up to ``max_batch`` that fits, to within :data:`RESOLUTION` (0: not
        even the smallest): doubling while it fits, then bisecting."""
        if not self.fits(self.smallest):
            return 0
        fit, over = self.smallest, None
        while over is None and fit < max_batch:
            step = min(2 * fit, max_batch)
            if self.fits(step):
                fit = step
            else:
                over = step
        while over is not None and over - fit > max(1, int(fit * RESOLUTION)):
            middle = (fit + over) // 2
            if self.fits(middle):
                fit = middle
            else:
                over = middle
        return fit

    def ladder(self, batch: int) -> bool:
        """Whether a given ``batch`` fits, running the smallest batch and twice that first, so
        that the line can keep a batch far over the budget from running at all."""
        first = self.smallest
        return all(self.fits(step) for step in sorted({first, 2 * first, batch}) if step <= batch)

    def start(self) -> str | None:
        """Run the smallest batch: 1, or 2 when a step on one row fails (BatchNorm in training); the
        note to print when it is 2."""
        try:
            self.fits(1)
        except NotMeasured as one:
            self.trials.pop(1, None)
            self.smallest = 2
            try:
                self.fits(2)
            except NotMeasured:
                raise one from None
            return f"batch 1 does not train ({one}): the search starts at 2"
        return None

    def settle(self, batch: int) -> Trial:
        """``batch`` run for :data:`SETTLED_STEPS` steps: the peak a run keeps at it."""
        if batch not in self.settled:
            self.settled[batch] = self.measure(batch, SETTLED_STEPS)
        return self.settled[batch]

    def lower(self, batch: int) -> int:
        """After ``batch`` settled over the budget: the largest batch below it measured under the
        budget by the same margin (short peak scaled by ``batch``'s settled ÷ short); 0 when none
        is."""
        scale = self.settled[batch].peak / max(self.trials[batch].peak, 1.0)
        under = [
            b
            for b, t in self.trials.items()
            if t.ran and b < batch and t.peak * max(scale, 1.0) <= self.budget
        ]
        return max(under, default=0)

    def line(self) -> str:
        ran = [t for t in sorted(self.trials.values(), key=lambda t: t.batch) if t.ran]
        text = ", ".join(f"{t.batch}: {t.peak / GiB:.2f}" for t in ran)
        skipped = [t for t in self.trials.values() if not t.ran]
        if skipped:
            text += "; not run, predicted over the budget: " + ", ".join(
                f"{t.batch}: {t.peak / GiB:.2f}" for t in sorted(skipped, key=lambda t: t.batch)
            )
        settled = ", ".join(f"{b}: {t.peak / GiB:.2f}" for b, t in sorted(self.settled.items()))
        return text + (f"; after {SETTLED_STEPS} steps {settled}" if settled else "")


@dataclass
class TrainerStandIn:
    """What a ``training_step`` and ``configure_optimizers`` commonly read of the Trainer, answered
    as Lightning would for the planned run (``barebones`` makes ``self.log`` a no-op)."""

    model: nn.Module
    datamodule: Any = None
    max_epochs: int | None = None
    max_steps: int = -1
    estimated_stepping_batches: float = math.inf
    accumulate_grad_batches: int = 1
    num_devices: int = 1
    world_size: int = 1
    barebones: bool = True
    global_step: int = 0
    current_epoch: int = 0
    logger: Any = None
    loggers: list[Any] = field(default_factory=list)
    global_rank: int = 0
    local_rank: int = 0

    @property
    def lightning_module(self) -> nn.Module:
        return self.model


def stand_in(
    run: PlannedRun, model: nn.Module, datamodule: Any, loader_batches: float
) -> TrainerStandIn:
    """The Trainer ``run`` will have, as a ``training_step`` sees it."""
    return TrainerStandIn(
        model,
        datamodule,
        run.epochs,
        run.max_steps,
        run.stepping_batches(loader_batches),
        run.accumulation,
        run.devices,
        run.ranks,
    )


class TrainingRows:
    """Batches of any size from the dataset of the datamodule's own training loader."""

    def __init__(self, datamodule: Any) -> None:
        try:
            loader = datamodule.train_dataloader()
        except Exception as err:
            raise NotMeasured(f"the datamodule's train_dataloader() failed ({_said(err)})") from err
        if not isinstance(loader, DataLoader):
            raise NotMeasured(
                f"the datamodule's train_dataloader() returns a {type(loader).__name__}, "
                "not one torch DataLoader"
            )
        self.datamodule, self.dataset = datamodule, loader.dataset
        self.loader_batches = float(_length(loader) or math.inf)
        # a loader made with batch_size=None converts rows without stacking them
        custom = loader.collate_fn is not default_convert
        self.collate = loader.collate_fn if custom else default_collate
        self.iterable = isinstance(self.dataset, IterableDataset)
        self.rows = None if self.iterable else _length(self.dataset)

    def batch(self, size: int) -> Any:
        generator = torch.Generator().manual_seed(ROWS_SEED)
        loader = DataLoader(
            self.dataset,
            batch_size=size,
            shuffle=not self.iterable,
            generator=generator,
            collate_fn=self.collate,
            num_workers=0,
        )
        try:
            return next(iter(loader))
        except Exception as err:
            raise NotMeasured(f"a batch of {size} training rows failed ({_said(err)})") from err


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:
        return None


def _said(err: BaseException) -> str:
    """An exception as one line of the preflight's message."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:200]}" if text else type(err).__name__


def _optimizers(module: Any) -> tuple[list[torch.optim.Optimizer], str | None]:
    """The optimizers of the module's ``configure_optimizers``, in any form Lightning takes, and a
    note when its scheduler was left out (it read something the stand-in cannot answer)."""
    from lightning.pytorch.core.optimizer import _configure_optimizers

    note = None
    try:
        configured = module.configure_optimizers()
    except Exception as err:
        if not (isinstance(err, AttributeError) and isinstance(err.obj, TrainerStandIn)):
            raise NotMeasured(
                f"configure_optimizers() failed outside a Trainer ({_said(err)})"
            ) from err
        configured = _made_before(err)
        note = (
            f"measured without the learning-rate scheduler: configure_optimizers() reads "
            f"trainer.{err.name}, which the preflight cannot answer before the Trainer exists"
        )
    optimizers = _configure_optimizers(configured)[0] if configured else []
    if not optimizers:
        raise NotMeasured("configure_optimizers() returned no optimizer")
    return list(optimizers), note


def _made_before(err: BaseException) -> list[torch.optim.Optimizer]:
    """The optimizers the frames of ``err``'s traceback hold (made before it was raised)."""
    found: dict[int, torch.optim.Optimizer] = {}
    trace = err.__traceback__
    while trace is not None:
        for value in trace.tb_frame.f_locals.values():
            if isinstance(value, torch.optim.Optimizer):
                found[id(value)] = value
        trace = trace.tb_next
    return list(found.values())


def _state_bytes(module: nn.Module) -> int:
    """Bytes of the module's parameters and buffers (each storage once)."""
    seen: dict[int, int] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _optimizer_bytes(optimizers: list[torch.optim.Optimizer]) -> float:
    return sum(
        value.nbytes
        for optimizer in optimizers
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    )


class StepMeasurer:
    """Trains a deep copy of ``module`` on ``rows`` and returns the run's peak per rank at each
    batch: the counter's peak less what the copy adds, with the strategy's change
    (:meth:`_strategy_bytes`)."""

    def __init__(
        self,
        module: Any,
        rows: TrainingRows,
        device: torch.device,
        precision: str,
        counter: PeakCounter,
        run: PlannedRun | None = None,
    ) -> None:
        self.rows, self.device, self.precision, self.counter = rows, device, precision, counter
        self.run = run = run or PlannedRun()
        before = counter.level()
        try:
            self.copy = copy.deepcopy(module)
        except Exception as err:
            raise NotMeasured(f"the module cannot be deep-copied ({_said(err)})") from err
        self.copy_bytes = _state_bytes(self.copy)
        self._move()
        self.copy.train()
        self.copy._trainer = stand_in(run, self.copy, rows.datamodule, rows.loader_batches)
        self.optimizers, self.note = _optimizers(self.copy)
        self.weights = float(_state_bytes(self.copy))
        self.grads = float(
            sum(p.numel() * p.element_size() for p in self.copy.parameters() if p.requires_grad)
        )
        # on CPU the whole process counts (budget.py), less the copy; on a device, this job's share
        self.offset = float(self.copy_bytes) if counter.kind == "cpu" else before

    def _move(self) -> None:
        """The copy on the device in a true precision's dtype; an OOM on the way refuses the job."""
        from laptrain.callbacks.oom_backoff import is_oom

        dtype = TRUE_DTYPES.get(self.precision)
        try:
            self.copy.to(self.device)
            if dtype is not None:
                self.copy.to(dtype)
        except Exception as err:
            if not is_oom(err):
                raise
            del self.copy
            release_freed(self.counter.kind)
            raise PreflightError(
                f"this job does not fit even at micro batch 1: a copy of the module "
                f"({self.copy_bytes / GiB:.2f} GiB) ran out of memory moving to {self.device}: "
                "free memory on it or make the model smaller"
            ) from None

    def _strategy_bytes(self) -> float:
        """What the strategy adds (DDP) or takes off (FSDP) the peak of one process holding the
        whole module. DDP's Reducer keeps one more gradient-sized buffer in its buckets
        (torch/nn/parallel/distributed.py:86-109; Lightning leaves ``gradient_as_bucket_view``
        False, strategies/ddp.py:196); FSDP (FULL_SHARD) keeps 1/ranks of weights, grads and
        optimizer state."""
        if self.run.ranks == 1:
            return 0.0
        if not self.run.sharded:
            return self.grads
        state = self.weights + self.grads + _optimizer_bytes(self.optimizers)
        return -state * (1 - 1 / self.run.ranks)

    def _input(self, batch: Any) -> Any:
        from lightning.fabric.utilities.apply_func import apply_to_collection

        module = self.copy
        batch = module.on_before_batch_transfer(batch, 0)
        batch = module.transfer_batch_to_device(batch, self.device, 0)
        batch = module.on_after_batch_transfer(batch, 0)
        dtype = TRUE_DTYPES.get(self.precision)
        if dtype is None:
            return batch
        return apply_to_collection(
            batch, torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t
        )

    def _step(self, batch: Any, index: int) -> None:
        from laptrain.preflight.activations import _autocast

        with _autocast(self.device, self.precision):
            out = self.copy.training_step(batch, index)
        loss = out.get("loss") if isinstance(out, Mapping) else out
        if not isinstance(loss, torch.Tensor):
            raise NotMeasured(
                "training_step returned no loss tensor (a tensor, or a dict with 'loss')"
            )
        self.counter.note()
        loss.backward()
        self.counter.note()
        for optimizer in self.optimizers:
            optimizer.step()
            self.counter.note()
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)

    def __call__(self, size: int, steps: int = STEPS_PER_TRIAL) -> Trial:
        from laptrain.callbacks.oom_backoff import is_oom

        batch = self._input(self.rows.batch(size))
        release_freed(self.counter.kind)
        self.counter.reset()
        start = self.counter.level()
        try:
            with torch.enable_grad():
                for index in range(steps):
                    self._step(batch, index)
        except NotMeasured:
            raise
        except Exception as err:
            if not is_oom(err):
                raise NotMeasured(f"training_step failed at batch {size} ({_said(err)})") from err
            for optimizer in self.optimizers:
                optimizer.zero_grad(set_to_none=True)
            return Trial(size, math.inf, steps=steps)
        finally:
            peak = self.counter.peak()
            del batch
            release_freed(self.counter.kind)
        run_peak = peak - self.offset + self._strategy_bytes()
        return Trial(size, run_peak, rise=max(0.0, peak - start), steps=steps)

    def estimate(self, trial: Trial) -> Estimate:
        """The run's peak at ``trial`` on each rank by part, as batch.py's plan records it (DDP's
        buckets count as gradients; under FSDP each rank's share of the state)."""
        share = 1 / self.run.ranks if self.run.sharded else 1.0
        weights, optimizer = self.weights * share, _optimizer_bytes(self.optimizers) * share
        buckets = self.grads if self.run.ranks > 1 and not self.run.sharded else 0.0
        grads = self.grads * share + buckets
        activations = max(0.0, trial.rise - self.grads)
        return Estimate(
            micro_batch=trial.batch,
            seq_len=0,
            weights=weights,
            grads=grads,
            optimizer=optimizer,
            activations=activations,
            transient=0.0,
            overhead=trial.peak - weights - grads - optimizer - activations,
        )

    def close(self) -> None:
        self.optimizers.clear()
        del self.copy
        release_freed(self.counter.kind)


@contextlib.contextmanager
def kept_rng(device: torch.device) -> Iterator[None]:
    """Put back every RNG state a training step can draw from: torch's, Python's and numpy's."""
    python_state = random.getstate()
    try:
        import numpy

        numpy_state: Any = numpy.random.get_state()
    except ImportError:
        numpy, numpy_state = None, None
    devices = [device.index or 0] if device.type in ("cuda", "mps") else []
    kind = device.type if devices else None
    try:
        with torch.random.fork_rng(devices=devices, device_type=kind):
            yield
    finally:
        random.setstate(python_state)
        if numpy is not None:
            numpy.random.set_state(numpy_state)


def _checked_module(model: Any) -> None:
    import lightning.pytorch as pl

    if not isinstance(model, pl.LightningModule):
        raise NotMeasured(f"{type(model).__name__} is not a LightningModule")
    if isinstance(model, ChunksBatches) and model.micro_batch_size:
        raise NotMeasured(
            "the model runs its loader batch in chunks (micro_batch_size), which the measured "
            "preflight does not size"
        )
    if not model.automatic_optimization:
        raise NotMeasured(
            "the module optimizes by hand (automatic_optimization=False): its training_step needs "
            "a Trainer"
        )


@dataclass(frozen=True)
class _Sizing:
    """What the search answered: the batch, accumulation and the trial behind them."""

    micro: int
    accumulation: int
    trial: Trial
    notes: list[str]


def _size(search: BatchSearch, request: PlanRequest, rows: int | None, budget: Budget) -> _Sizing:
    """The batch: the largest that fits (``auto``; an earlier session's while it fits) or the fixed
    one, checked; settled over :data:`SETTLED_STEPS` steps. Raises PreflightError when none fits."""
    started = search.start()
    notes = [started] if started else []
    if not request.auto:
        return _fixed(search, request, rows, budget, notes)
    top = min(request.max_batch, rows) if rows else request.max_batch
    if rows and rows < request.max_batch:
        notes.append(f"the training set has {rows} rows: no batch above that")
    previous = request.previous
    if previous and previous[0] <= top and search.ladder(previous[0]):
        trial = search.settle(previous[0])
        if trial.peak <= budget.bytes:
            return _Sizing(*previous, trial, [*notes, kept_note(previous)])
    fit = search.largest_fit(top)
    for _ in range(LOWERINGS):
        if fit == 0:
            break
        micro, accumulation = request.auto_batch(fit)
        if not search.fits(micro):  # an aligned or dividing batch below the fit, measured too
            micro = fit
        trial = search.settle(micro)
        if trial.peak <= budget.bytes:
            return _Sizing(micro, accumulation, trial, notes)
        fit = search.lower(micro)
    one = search.settled.get(search.smallest) or search.trials[search.smallest]
    raise PreflightError(
        f"this job does not fit even at micro batch {one.batch}: measured peak "
        f"{one.peak / GiB:.2f} GiB > "
        f"budget {budget.bytes / GiB:.2f} GiB ({budget.source}): free memory, raise the budget "
        "(hardware.memory_budget_gb, hardware.memory_fraction) or make the model smaller"
    )


def _fixed(
    search: BatchSearch, request: PlanRequest, rows: int | None, budget: Budget, notes: list[str]
) -> _Sizing:
    """A fixed batch, refused when it does not fit; accumulation keeps the effective batch."""
    micro = min(request.size, rows) if rows else request.size
    fits = search.ladder(micro)
    trial = search.settle(micro) if fits else max(search.trials.values(), key=lambda t: t.batch)
    if trial.peak > budget.bytes:
        how = "measured" if trial.ran else "predicted from the smaller batches"
        option = request.option
        raise PreflightError(
            f"{option}={request.size} does not fit: {how} peak {trial.peak / GiB:.2f} GiB "
            f"at batch {trial.batch} > budget {budget.bytes / GiB:.2f} GiB ({budget.source}): set "
            f"{option} lower, or hardware.batch_size=auto with data.batch_size=from_profile "
            "(the preflight picks)"
        )
    return _Sizing(micro, request.fixed_accumulation(micro), trial, notes)


def measured_plan(
    model: Any,
    datamodule: Any,
    request: PlanRequest,
    device: RunDevice,
    workers: WorkerCost | None = None,
    counter: PeakCounter | None = None,
) -> BatchDecision:
    """The measured plan of a run (the sizer of ``laptrain.preflight.planner.measured``);
    ``counter``: the memory reader. Raises NotMeasured or PreflightError, in one line."""
    _checked_module(model)
    kind, index = device.kind, device.index
    budget = device_budget(
        TorchProbe(kind, index), request.memory_fraction, request.memory_budget_gb, workers
    )
    where = torch.device(kind, index) if index is not None else torch.device(kind)
    counter = counter or counter_for(kind, index)
    measurer = StepMeasurer(
        model, TrainingRows(datamodule), where, device.precision, counter, request.run
    )
    return _measured_plan(measurer, request, budget)


def _measured_plan(measurer: StepMeasurer, request: PlanRequest, budget: Budget) -> BatchDecision:
    """The batch the search finds with ``measurer`` (closed afterwards), as a plan."""
    with kept_rng(measurer.device), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log outside a Trainer; the run shows the rest
        try:
            search = BatchSearch(measurer, budget.bytes)
            sizing = _size(search, request, measurer.rows.rows, budget)
            estimate = measurer.estimate(sizing.trial)
        finally:
            measurer.close()
    run = measurer.run
    notes = [
        f"measured: {STEPS_PER_TRIAL} training steps of a copy of the module at each batch tried, "
        f"on its own training rows; peak GiB by batch {search.line()}",
        *sizing.notes,
        *([measurer.note] if measurer.note else []),
    ]
    if run.ranks > 1:
        notes.append(
            f"per rank of {run.ranks}: "
            + ("1/N of the model state (FSDP)" if run.sharded else "with DDP's gradient buckets")
        )
    return decision(
        request,
        measurer.precision,
        (sizing.micro, sizing.accumulation),
        seq_len=0,
        device=measurer.device.type,
        budget=budget,
        estimate=estimate,
        checkpointing=False,
        notes=notes,
    )
