"""Fine-tuning the real all-MiniLM-L6-v2 on the default data: laptrain vs a plain loop vs HF Trainer.

The job is ``python train.py experiment=minilm hardware=cpu``: the pretrained all-MiniLM-L6-v2
(BertModel, 22.7 M parameters, from the pinned wheel in conf/model/minilm_classifier.yaml, cached
under the laptrain cache) with a new classification head, on ``data=stdlib_docstrings`` (which
family of Python's standard library a docstring comes from), batch 16, AdamW (lr 1e-4, weight
decay 0.01, biases and norms undecayed, fused), linear schedule with 10 % warm-up. Every arm is a
fresh process that composes and builds the job as train.py does (``laptrain.commands.bench.build_job``:
the Hydra config, ``laptrain.job.run.build``, the model initialised from the job's seed), so the
arms start from the same weights and the same tokenized splits.

Throughput (the default): one epoch per arm (or ``--steps`` optimizer steps), the first
``--warmup`` steps untimed, in ``--repeats`` rounds with the arm order rotated each round (a load
trend then favours no arm); each arm's figure is the median over rounds, its ratio the median of
the per-round ratios. A whole epoch, because laptrain's and HF's samplers draw different batches:
over an epoch both train on every sample once, while a short window's mean length depends on the
sampler (laptrain shuffles its length-grouped batches over the epoch, HF walks each mega-batch of
50 batches longest first, so a window that ends inside a mega-batch holds its longest batches);
with seed 42 on this data, batches 4 to 123 hold 41.2 computed tokens per sample under laptrain's
sampler and 48.6 under HF's, against 44.0 over the epoch for both: a 120-step window would have
credited laptrain with ~17 % more samples/s for nothing.

- laptrain: ``Trainer.fit`` with the job's default callbacks (minus the progress bar) and its
  TensorBoard logger, no validation (``laptrain.commands.bench.make_trainer``); the periodic checkpoint
  (every 250 steps) saves once in the epoch, as in a train.py run;
  laptrain's model computes its last encoder layer for the [CLS] position only, the one the head
  reads (``model.last_layer_first_token``, laptrain.families.classifier.first_token); the other arms
  get the model as transformers builds it (``model.last_layer_first_token=false``), as their users
  would;
- plain loop: the same weights and the same batches from laptrain's train loader (same order),
  ``loss.backward(); optimizer.step(); scheduler.step(); zero_grad()`` with the module's own
  optimizer groups and schedule, no Lightning;
- HF group_by_length: ``transformers.Trainer`` on the same tokenized train split (padding per
  batch by ``DataCollatorWithPadding``), ``train_sampling_strategy="group_by_length"``, the same
  lr, weight decay, warm-up steps, linear schedule and batch, its default fused AdamW, no
  progress bar (as the laptrain arm).

A step's time runs from the end of one optimizer step to the end of the next, so loading the
batch, every hook, the optimizer and logging are inside; samples/s is the timed steps' samples over
their wall time. Each schedule spans the steps run (the epoch, or ``warmup + steps``). Real ÷
computed tokens is over the timed batches (padding); peak RSS is the child process's.
Below the table: laptrain's time over the plain loop step by step (the same batches in the same
order; Lightning runs checkpoint callbacks last, so a save shows in the step after it), and each
laptrain callback's time in its per-batch hooks (``overhead.timed_hooks``; both checkpoint
callbacks share the ModelCheckpoint row).

Accuracy (``--accuracy``): full runs, per seed (the seed also picks the data split, as
``split_seed: ${seed}`` in conf/data/stdlib_docstrings.yaml): ``trainer.max_epochs`` epochs
(3 for experiment=minilm).

- HF: ``transformers.Trainer`` as above, evaluating accuracy on laptrain's validation split after
  each epoch, saving each epoch (at most 2 kept) and ``load_best_model_at_end`` by validation
  accuracy, because laptrain tests the best-by-``val/acc`` checkpoint (laptrain.job.run._train:
  ``ckpt_path=best_model_path``); test accuracy is then measured on laptrain's test split by
  ``vs_hf.test_accuracy``;
- laptrain: ``python train.py experiment=minilm hardware=cpu seed=S hydra.run.dir=<tmp>``, test
  accuracy read from the run folder's metrics.json (``test/acc``).

Wall time is from launching the process to its end, which for HF is when the test accuracy is
known and for laptrain a few seconds later (after the test it exports the model and writes its
report).

    python benchmarks/real_minilm.py [--steps 0 (an epoch)] [--warmup 3] [--repeats 2]
    python benchmarks/real_minilm.py --accuracy [--seeds 42,1,2] [--arms hf,laptrain]
    python benchmarks/real_minilm.py --smoke [--accuracy]   # the tiny model, a small data share

Run it alone on the machine (each arm uses all cores); about 11 min for the throughput table and
about 6 min per seed and arm for the accuracy table on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from run_all import TINY
from vs_hf import test_accuracy

ROOT = Path(__file__).resolve().parents[1]
JOB = ["experiment=minilm", "hardware=cpu"]
# laptrain's tiny test model on a tenth of the default data's train split, one epoch
SMOKE_JOB = ["hardware=cpu", *TINY, "data.train_fraction=0.1", "trainer.max_epochs=1"]
ARMS = ("laptrain", "plain loop", "HF group_by_length")
GOALS = {"plain loop": 0.97, "HF group_by_length": 1.1}  # the issue: laptrain samples/s ratio


# ---- timing ------------------------------------------------------------------------------------


def tokens(batch: Any) -> tuple[int, int]:
    """(real, computed) tokens of a padded batch."""
    mask = batch["attention_mask"]
    return int(mask.sum()), mask.numel()


def timed(marks: list[float], sizes: list[tuple[int, int, int]], warmup: int) -> dict[str, Any]:
    """What the steps after ``warmup`` measured: ``marks[i]`` is the end of step i, ``sizes[i]``
    its (samples, real tokens, computed tokens)."""
    steps = marks[warmup - 1 :] if warmup else marks
    kept = sizes[warmup : warmup + len(steps) - 1]
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    return {
        "seconds": steps[-1] - steps[0],
        "step_p50": statistics.median(gaps),
        "gaps": gaps,
        "samples": sum(s[0] for s in kept),
        "real": sum(s[1] for s in kept),
        "computed": sum(s[2] for s in kept),
    }


def laptrain_arm(job: Any, steps: int, warmup: int) -> dict[str, Any]:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ProgressBar
    from overhead import timed_hooks

    from laptrain.commands.bench import job_callbacks, make_trainer

    spent: dict[str, float] = defaultdict(float)  # each callback's time in its per-batch hooks

    class StepEnds(pl.Callback):
        def __init__(self) -> None:
            self.marks: list[float] = []
            self.sizes: list[tuple[int, int, int]] = []
            self.before: dict[str, float] = {}

        def on_train_batch_end(self, trainer: Any, module: Any, out: Any, batch: Any, i: int):
            self.marks.append(time.perf_counter())
            self.sizes.append((len(batch["labels"]), *tokens(batch)))
            if len(self.marks) == warmup:  # the timed steps' hook time only
                self.before = dict(spent)

    clock = StepEnds()
    callbacks = [c for c in job_callbacks(job) if not isinstance(c, ProgressBar)]
    for callback in callbacks:
        timed_hooks(callback, spent)
    # last: its batch-end mark comes after the other callbacks' batch-end hooks
    trainer = make_trainer(
        job,
        warmup + steps if steps else -1,
        [*callbacks, clock],
        epochs=-1 if steps else 1,
        enable_progress_bar=False,
    )
    trainer.fit(job.model, datamodule=job.datamodule)
    hooks = {name: total - clock.before.get(name, 0.0) for name, total in spent.items()}
    return {**timed(clock.marks, clock.sizes, warmup), "hooks": hooks}


def plain_arm(job: Any, steps: int, warmup: int) -> dict[str, Any]:
    """The classifier's optimizer groups and schedule (TextClassifierModule.configure_optimizers)
    in a for loop over laptrain's train loader."""
    from transformers import get_linear_schedule_with_warmup

    module = job.model
    params = [p for p in module.model.parameters() if p.requires_grad]
    optimizer = module.optimizer_factory(
        [
            {"params": [p for p in params if p.ndim >= 2]},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ]
    )
    loader = job.datamodule.train_dataloader()
    total = warmup + steps if steps else len(loader)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(total * module.warmup_ratio), total)
    module.train()
    marks: list[float] = []
    sizes: list[tuple[int, int, int]] = []
    for batch in loader:
        loss = module.model(**batch).loss
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        marks.append(time.perf_counter())
        sizes.append((len(batch["labels"]), *tokens(batch)))
        if len(marks) == total:
            break
    return timed(marks, sizes, warmup)


class CountingCollator:
    """A collator that records (samples, real, computed tokens) of each batch it makes."""

    def __init__(self, collate: Any) -> None:
        self.collate = collate
        self.sizes: list[tuple[int, int, int]] = []

    def __call__(self, rows: list[dict[str, Any]]) -> Any:
        batch = self.collate(rows)
        self.sizes.append((len(rows), *tokens(batch)))
        return batch


def hf_trainer(
    job: Any,
    folder: Path,
    seed: int,
    epochs: int,
    max_steps: int = -1,
    evaluate: bool = False,
    callbacks: list[Any] | None = None,
) -> Any:
    """``transformers.Trainer`` on the job's model and tokenized splits, with the job's batch,
    lr, weight decay, warm-up share and a linear schedule; ``evaluate``: accuracy on the
    validation split every epoch, the best epoch's weights loaded at the end."""
    import numpy as np
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

    dm = job.datamodule
    keep = ("input_ids", "labels", "length")

    def split(name: str) -> Any:
        ds = dm.splits[name]
        return ds.remove_columns([c for c in ds.column_names if c not in keep])

    train = split("train")
    batch = int(job.plan.loader_batch)
    total = max_steps if max_steps > 0 else math.ceil(len(train) / batch) * epochs
    optimizer = job.cfg.model.optimizer
    if evaluate:
        extra: dict[str, Any] = {
            "eval_strategy": "epoch",
            "save_strategy": "epoch",
            "save_total_limit": 2,
            "load_best_model_at_end": True,
            "metric_for_best_model": "accuracy",
        }
    else:
        extra = {"save_strategy": "no"}
    args = TrainingArguments(
        output_dir=str(folder / "hf"),
        per_device_train_batch_size=batch,
        per_device_eval_batch_size=int(job.plan.eval_batch),
        num_train_epochs=epochs,
        max_steps=max_steps,
        learning_rate=float(optimizer.lr),
        weight_decay=float(optimizer.weight_decay),
        warmup_steps=int(total * float(job.cfg.model.warmup_ratio)),  # as configure_optimizers
        lr_scheduler_type="linear",
        seed=seed,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        train_sampling_strategy="group_by_length",
        length_column_name="length",
        **extra,
    )

    def accuracy(prediction: Any) -> dict[str, float]:
        logits = prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        return {"accuracy": float((np.argmax(logits, -1) == prediction.label_ids).mean())}

    return Trainer(
        model=job.model.model,
        args=args,
        train_dataset=train,
        eval_dataset=split("val") if evaluate else None,
        data_collator=CountingCollator(DataCollatorWithPadding(dm.tokenizer)),
        processing_class=dm.tokenizer,
        compute_metrics=accuracy if evaluate else None,
        callbacks=callbacks,
    )


def hf_arm(job: Any, steps: int, warmup: int, folder: Path, seed: int) -> dict[str, Any]:
    from transformers import TrainerCallback

    class StepEnds(TrainerCallback):
        def __init__(self) -> None:
            self.marks: list[float] = []

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            self.marks.append(time.perf_counter())

    clock = StepEnds()
    max_steps = warmup + steps if steps else -1
    trainer = hf_trainer(job, folder, seed, 1, max_steps=max_steps, callbacks=[clock])
    trainer.train()
    # the collator's batches in the order made (one may be fetched ahead: it comes last)
    return timed(clock.marks, trainer.data_collator.sizes, warmup)


# ---- child processes ---------------------------------------------------------------------------


def child(spec: dict[str, Any]) -> None:
    from laptrain.commands.bench import build_job

    folder = Path(spec["folder"])
    seed = int(spec["seed"])
    job = build_job(
        [*spec["overrides"], *plain_model(spec), f"seed={seed}"], folder, lambda _: None
    )
    if spec["mode"] == "accuracy":
        epochs = int(job.cfg.trainer.max_epochs)
        trainer = hf_trainer(job, folder, seed, epochs, evaluate=True)
        trainer.train()
        result: dict[str, Any] = {"accuracy": test_accuracy(trainer.model, job.datamodule)}
    else:
        arm, steps, warmup = spec["arm"], int(spec["steps"]), int(spec["warmup"])
        if arm == "laptrain":
            result = laptrain_arm(job, steps, warmup)
        elif arm == "plain loop":
            result = plain_arm(job, steps, warmup)
        else:
            result = hf_arm(job, steps, warmup, folder, seed)
    result["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (
        1 if sys.platform == "darwin" else 1024
    )
    print("RESULT " + json.dumps(result), flush=True)


def plain_model(spec: dict[str, Any]) -> list[str]:
    """The plain loop and HF train the model as transformers builds it: laptrain's first-token
    last layer (laptrain.families.classifier.first_token) is part of the laptrain arm only."""
    laptrain = spec["mode"] == "throughput" and spec["arm"] == "laptrain"
    return [] if laptrain else ["model.last_layer_first_token=false"]


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One arm in a fresh process; its result, with ``wall``: seconds from launch to exit."""
    Path(spec["folder"]).mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"{spec} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return {**json.loads(lines[-1][len("RESULT ") :]), "wall": wall}


def run_train_py(overrides: list[str], seed: int, folder: Path) -> dict[str, Any]:
    """``python train.py <overrides> seed=S`` into ``folder``: test accuracy and wall time."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "train.py", *overrides, f"seed={seed}", f"hydra.run.dir={folder}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    metrics = folder / "metrics.json"
    if done.returncode != 0 or not metrics.is_file():
        tail = (done.stdout + done.stderr)[-3000:]
        raise SystemExit(f"train.py seed={seed} failed (exit {done.returncode}):\n{tail}")
    return {"accuracy": json.loads(metrics.read_text())["test/acc"], "wall": wall}


# ---- the two measurements ----------------------------------------------------------------------


def throughput(args: argparse.Namespace, overrides: list[str], tmp: Path) -> None:
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for r in range(args.repeats):
        for arm in ARMS[r % 3 :] + ARMS[: r % 3]:  # rotated: each arm leads once in 3 rounds
            spec = {
                "mode": "throughput",
                "arm": arm,
                "steps": args.steps,
                "warmup": args.warmup,
                "seed": args.seed,
                "overrides": overrides,
                "folder": str(tmp / f"{arm.replace(' ', '_')}-{r}"),
            }
            results[arm].append(run_child(spec))
    from arms import machine_line

    print(machine_line())
    print(
        f"job: {' '.join(overrides)} seed={args.seed}; "
        f"{f'{args.steps} steps' if args.steps else 'one epoch'} timed after the first "
        f"{args.warmup} steps; {args.repeats} rounds, arm order rotated; medians\n"
    )
    print(
        "| arm | samples/s | laptrain ÷ arm | goal | met? | s/step (p50) | real tokens/s | "
        "computed tokens/sample | real ÷ computed | peak RSS GB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    speed = {arm: [r["samples"] / r["seconds"] for r in rs] for arm, rs in results.items()}
    for arm, rs in results.items():
        ratio = statistics.median(a / b for a, b in zip(speed["laptrain"], speed[arm]))
        goal = GOALS.get(arm)
        met = "-" if goal is None else ("yes" if ratio >= goal else "no")
        print(
            f"| {arm} | {statistics.median(speed[arm]):.2f} | {ratio:.3f} | "
            f"{'-' if goal is None else f'≥ {goal}'} | {met} | "
            f"{statistics.median(r['step_p50'] for r in rs):.3f} | "
            f"{statistics.median(r['real'] / r['seconds'] for r in rs):.0f} | "
            f"{statistics.median(r['computed'] / r['samples'] for r in rs):.1f} | "
            f"{statistics.median(r['real'] / r['computed'] for r in rs):.2f} | "
            f"{max(r['rss'] for r in rs) / 1e9:.2f} |"
        )
    print(
        "\nlaptrain and the plain loop train on the same batches; HF's sampler draws others "
        "(tokens/sample; the same samples over a whole epoch). RSS: the largest over rounds."
    )
    print(extra_time(results["laptrain"], results["plain loop"], args.warmup))
    print("\n| laptrain callback | its per-batch hooks, s over the timed steps | ms/step |")
    print("|---|---|---|")
    hooks = defaultdict(list)
    for r in results["laptrain"]:
        for name, seconds in r["hooks"].items():
            hooks[name].append(seconds)
    steps = len(results["laptrain"][0]["gaps"])
    for name, seconds in sorted(hooks.items(), key=lambda kv: -statistics.median(kv[1])):
        median = statistics.median(seconds)
        print(f"| {name} | {median:.2f} | {median / steps * 1e3:.2f} |")


def extra_time(laptrain: list[dict[str, Any]], plain: list[dict[str, Any]], warmup: int) -> str:
    """Where laptrain's time over the plain loop goes: the same batches in the same order, so
    step j of one arm is step j of the other; per round, then the median round."""
    rounds = []
    for a, b in zip(laptrain, plain):
        diff = [x - y for x, y in zip(a["gaps"], b["gaps"])]
        top = sorted(range(len(diff)), key=lambda j: -diff[j])[:3]
        rounds.append((sum(diff), statistics.median(diff), sum(b["gaps"]), top, diff))
    total, median, base, top, diff = sorted(rounds, key=lambda r: r[0])[len(rounds) // 2]
    largest = ", ".join(f"step {warmup + j + 1} {diff[j] * 1e3:+.0f} ms" for j in top)
    return (
        f"laptrain − plain loop, step by step on the same batches (median round): "
        f"{total:+.2f} s over {len(diff)} steps ({total / base:+.1%}), median step "
        f"{median * 1e3:+.1f} ms; largest: {largest}"
    )


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {round(seconds % 60):02d} s"


def accuracy(args: argparse.Namespace, overrides: list[str], tmp: Path) -> None:
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = set(arms) - {"hf", "laptrain"}
    if unknown:
        raise SystemExit(f"--arms: unknown {sorted(unknown)} (choose from hf, laptrain)")
    rows: dict[int, dict[str, dict[str, Any]]] = {}
    for i, seed in enumerate(args.seeds):
        rows[seed] = {}
        for arm in arms[i % len(arms) :] + arms[: i % len(arms)]:
            folder = tmp / f"{arm}-{seed}"
            if arm == "hf":
                spec = {"mode": "accuracy", "seed": seed, "overrides": overrides}
                rows[seed][arm] = run_child({**spec, "folder": str(folder)})
            else:
                rows[seed][arm] = run_train_py(overrides, seed, folder)
            print(f"seed {seed} {arm}: {rows[seed][arm]}", file=sys.stderr, flush=True)
    from arms import machine_line

    print(machine_line())
    print(
        f"job: {' '.join(overrides)}; full runs (train, validation each epoch, test on the "
        "best-by-validation weights); wall time from launching the process to its end\n"
    )
    print("| seed | laptrain test acc | HF test acc | laptrain wall | HF wall |")
    print("|---|---|---|---|---|")

    def cell(seed: int, arm: str, key: str) -> str:
        value = rows[seed].get(arm, {}).get(key)
        if value is None:
            return "-"
        return f"{value * 100:.1f} %" if key == "accuracy" else minutes(value)

    for seed in args.seeds:
        print(
            f"| {seed} | {cell(seed, 'laptrain', 'accuracy')} | {cell(seed, 'hf', 'accuracy')} | "
            f"{cell(seed, 'laptrain', 'wall')} | {cell(seed, 'hf', 'wall')} |"
        )
    summary = {}
    for arm in ("laptrain", "hf"):
        acc = [rows[s][arm]["accuracy"] for s in args.seeds if arm in rows[s]]
        wall = [rows[s][arm]["wall"] for s in args.seeds if arm in rows[s]]
        summary[arm] = (
            (
                f"{statistics.mean(acc) * 100:.1f} % (spread {(max(acc) - min(acc)) * 100:.1f})",
                minutes(statistics.mean(wall)),
            )
            if acc
            else ("-", "-")
        )
    print(
        f"| mean (max−min) | {summary['laptrain'][0]} | {summary['hf'][0]} | "
        f"{summary['laptrain'][1]} | {summary['hf'][1]} |"
    )


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=0, help="timed steps per arm (0: an epoch)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of the three arms")
    parser.add_argument("--seed", type=int, default=42, help="throughput: the job's seed")
    parser.add_argument("--accuracy", action="store_true", help="full runs: test accuracy")
    parser.add_argument("--seeds", default="42,1,2", help="--accuracy: comma-separated seeds")
    parser.add_argument("--arms", default="hf,laptrain", help="--accuracy: hf, laptrain or both")
    parser.add_argument(
        "--smoke", action="store_true", help="the tiny model on a tenth of the data (a check)"
    )
    parser.add_argument("overrides", nargs="*", help="more train.py overrides")
    args = parser.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    if args.smoke:
        args.steps, args.warmup, args.repeats = 3, 1, 1
        args.seeds = args.seeds[:1]
    if args.warmup < 1 or args.steps < 0:
        raise SystemExit("--warmup must be >= 1 and --steps >= 0")
    overrides = [*(SMOKE_JOB if args.smoke else JOB), *args.overrides]
    with tempfile.TemporaryDirectory(prefix="laptrain-minilm-") as tmp:
        (accuracy if args.accuracy else throughput)(args, overrides, Path(tmp))


if __name__ == "__main__":
    main()
