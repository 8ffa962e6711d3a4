"""laptrain's cost over a plain PyTorch loop: the same model, batches, order and optimizer.

Six arms, interleaved (plain, Lightning, laptrain, plain, ...) in one process so that machine
noise hits all alike, each the same ``--steps`` batches of the default job (or the job the
overrides compose), each with a fresh optimizer and learning-rate schedule:

- plain: ``loss.backward(); optimizer.step(); scheduler.step(); zero_grad()`` in a for loop;
- lightning: ``Trainer.fit`` with no callbacks and no logger (what Lightning alone costs), and
  the same with the job's logger (what any Lightning run that writes curves pays);
- laptrain: ``Trainer.fit`` with the job's full callback set (conf/callbacks/default.yaml) and
  its logger, as ``python train.py`` runs it;
- laptrain without the progress bar, and without the logger (and the learning-rate monitor,
  which needs one): what they cost outside their hooks.

A step is timed from one batch start to the next (every hook, the optimizer and logging inside);
the time per step of an arm is its timed steps' total over their number (periodic work, e.g. the
logging every 10 steps, is counted), and each arm's figure is the median over ``--repeats``, its ratio the median of the
per-repeat ratios to the plain loop.
The second table is each callback's own time per step in its per-batch hooks, measured in the
laptrain arm.

    python benchmarks/overhead.py [--steps 40] [--repeats 5] [train.py overrides ...]
    laptrain new my_mlp && python benchmarks/overhead.py model=my_mlp data=my_mlp hardware.batch_size=64

The last two columns are the cost per step over bare Lightning and over Lightning with the same
logger (each repeat's difference, then the median): the last one is what a user's own module pays
for laptrain's default callbacks beyond what writing TensorBoard curves costs in Lightning alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from arms import machine_line
from lightning.pytorch.callbacks import LearningRateMonitor, ProgressBar
from transformers import get_linear_schedule_with_warmup

from laptrain.checkpoints.stop import PER_BATCH_HOOKS
from laptrain.commands.bench import build_job, job_callbacks, make_trainer

# a user's own module (user/<name>/, `laptrain new`) imports as train.py sees it: from the clone
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WARMUP = 3  # untimed steps at the start of each arm (allocator warm-up, first kernels)


class Batches:
    """The same list of batches on every pass (a plain list would be read as several loaders)."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)


class BatchStarts(pl.Callback):
    """perf_counter at every batch start, and at the end of the last batch."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def on_train_batch_start(self, *args: Any) -> None:
        self.marks.append(time.perf_counter())

    def on_train_end(self, *args: Any) -> None:
        self.marks.append(time.perf_counter())


def per_step(marks: list[float]) -> float:
    timed = marks[WARMUP:]
    return (timed[-1] - timed[0]) / (len(timed) - 1)


def plain_loop(model: Any, batches: list[Any]) -> float:
    """The job's model in a for loop: laptrain's classifier with its optimizer and schedule
    (TextClassifierModule.configure_optimizers), any other module with its own
    ``configure_optimizers`` and ``training_step`` (a user's module, as written for Lightning:
    its ``self.log`` calls outside a Trainer return at once)."""
    if hasattr(model, "optimizer_factory") and hasattr(model, "warmup_ratio"):
        return _classifier_loop(model, batches)
    model._trainer = None  # detached from the last arm's Trainer: self.log returns at once
    optimizer = model.configure_optimizers()
    if isinstance(optimizer, dict):
        optimizer = optimizer["optimizer"]
    elif isinstance(optimizer, list | tuple):
        optimizer = optimizer[0]
    model.train()
    marks = []
    for index, batch in enumerate(batches):
        marks.append(time.perf_counter())
        loss = model.training_step(batch, index)
        loss = loss["loss"] if isinstance(loss, dict) else loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    marks.append(time.perf_counter())
    return per_step(marks)


def _classifier_loop(model: Any, batches: list[Any]) -> float:
    decay = [p for p in model.model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.model.parameters() if p.requires_grad and p.ndim < 2]
    optimizer = model.optimizer_factory(
        [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    )
    total = len(batches)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(total * model.warmup_ratio), total)
    model.train()
    marks = []
    for batch in batches:
        marks.append(time.perf_counter())
        loss = model.model(**batch).loss
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    marks.append(time.perf_counter())
    return per_step(marks)


def timed_hooks(callback: Any, spent: dict[str, float]) -> None:
    """Wrap the callback's per-batch hooks so that their time adds up in ``spent[name]``."""
    name = type(callback).__name__
    for hook in PER_BATCH_HOOKS:
        # overridden, and not set to None on the instance (a hook that would do nothing this run)
        if getattr(type(callback), hook) is not getattr(pl.Callback, hook) and getattr(
            callback, hook
        ):
            setattr(callback, hook, _timed(getattr(callback, hook), name, spent))


def _timed(fn: Any, name: str, spent: dict[str, float]) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - start

    return wrapped


def without(callbacks: list[Any], kind: type) -> list[Any]:
    return [c for c in callbacks if not isinstance(c, kind)]


def fit(
    job: Any, batches: list[Any], callbacks: list[Any], logger: bool, bar: bool = True
) -> float:
    clock = BatchStarts()
    trainer = make_trainer(job, len(batches), [clock, *callbacks], enable_progress_bar=bar)
    if not logger:
        trainer.loggers = []
    trainer.fit(job.model, train_dataloaders=Batches(batches))
    return per_step(clock.marks)


def first_batches(datamodule: Any, count: int) -> list[Any]:
    """``count`` batches of the train loader, taking further epochs when it has fewer."""
    batches: list[Any] = []
    while len(batches) < count:
        before = len(batches)
        for batch in datamodule.train_dataloader():
            batches.append(batch)
            if len(batches) == count:
                break
        if len(batches) == before:
            raise SystemExit("the train loader is empty")
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "overrides", nargs="*", help="train.py overrides (default: the default job)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="laptrain-overhead-") as tmp:
        job = build_job(args.overrides, Path(tmp), lambda _: None)
        batches = first_batches(job.datamodule, args.steps + WARMUP)
        times: dict[str, list[float]] = defaultdict(list)
        spent: dict[str, float] = defaultdict(float)
        timed_steps = 0
        for _ in range(args.repeats):
            times["plain loop"].append(plain_loop(job.model, batches))
            times["Lightning, no callbacks"].append(fit(job, batches, [], logger=False))
            times["Lightning, no callbacks, with the logger"].append(
                fit(job, batches, [], logger=True)
            )
            callbacks = job_callbacks(job)
            for callback in callbacks:
                timed_hooks(callback, spent)
            times["laptrain (default callbacks + logger)"].append(
                fit(job, batches, callbacks, logger=True)
            )
            timed_steps += len(batches)
            # costs outside the hooks (a refresh thread, the logger's writes): leave one out
            times["laptrain without the progress bar"].append(
                fit(job, batches, without(job_callbacks(job), ProgressBar), logger=True, bar=False)
            )
            times["laptrain without the logger"].append(
                fit(job, batches, without(job_callbacks(job), LearningRateMonitor), logger=False)
            )
    step = {arm: statistics.median(t) for arm, t in times.items()}
    plain = step["plain loop"]
    # the ratio of each repeat's arms (taken back to back), then the median: a load change
    # between repeats moves both sides of a ratio alike
    ratio = {
        arm: statistics.median(a / b for a, b in zip(t, times["plain loop"]))
        for arm, t in times.items()
    }
    print(machine_line())
    print(
        f"job: {' '.join(args.overrides) or 'default'}, batch {job.plan.loader_batch}, "
        f"{args.steps} timed steps x {args.repeats} repeats, interleaved; medians\n"
    )
    bare, logged = (
        times["Lightning, no callbacks"],
        times["Lightning, no callbacks, with the logger"],
    )
    print(
        "| arm | ms/step | ratio to plain loop | ms/step above bare Lightning "
        "| above Lightning with the same logger |"
    )
    print("|---|---|---|---|---|")
    for arm, value in step.items():
        above = statistics.median(a - b for a, b in zip(times[arm], bare)) * 1e3
        same = (
            f"{statistics.median(a - b for a, b in zip(times[arm], logged)) * 1e3:+.3f}"
            if "without the logger" not in arm
            and arm != "Lightning, no callbacks"
            and arm != "plain loop"
            else ""
        )
        print(f"| {arm} | {value * 1e3:.3f} | {ratio[arm]:.3f} | {above:+.3f} | {same} |")
    print("\n| callback | its hooks, ms/step | share of a plain step |")
    print("|---|---|---|")
    for name, total in sorted(spent.items(), key=lambda kv: -kv[1]):
        ms = total / timed_steps * 1e3
        print(f"| {name} | {ms:.3f} | {ms / 1e3 / plain:.2%} |")


if __name__ == "__main__":
    main()
