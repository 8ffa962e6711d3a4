"""laptrain vs Hugging Face's Trainer on a long-tailed text set built locally.

The same data (laptrain's tokenized train and test splits of benchmarks/longtail.py's CSV), the
same tokenizer, model (the job's BERT classifier, initialised from the same seed), max length,
batch, one epoch, fused AdamW (lr, weight decay, biases and norms undecayed) and linear schedule
with 10 % warm-up. Three arms, each a fresh process, alternating over ``--seeds`` with the order
rotated each seed (so that a load trend does not favour the arm that runs last):

- laptrain: ``Trainer.fit`` of the job with its default callbacks and logger (batches grouped by
  length, and the last layer computed for the [CLS] position only: laptrain's defaults);
- HF defaults: ``transformers.Trainer`` with its defaults (random order, padding per batch) on
  the model as transformers builds it;
- HF group_by_length: the same with ``train_sampling_strategy="group_by_length"``.

samples/s is training samples over the wall time of the epoch (data loading, hooks and logging
inside); tokens ratio is real tokens over computed (padded) tokens of the epoch's batches; peak
RSS is the child process's; test accuracy is computed by the same function for every arm.

    python benchmarks/vs_hf.py [--rows 3000] [--seeds 0,1,2] [train.py overrides ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from longtail import write_longtail_csv

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("laptrain", "HF defaults", "HF group_by_length")
GOALS = {"HF defaults": 3.0, "HF group_by_length": 1.1}  # issue 13: laptrain samples/s ratio


def test_accuracy(model: Any, datamodule: Any) -> float:
    import torch

    model.eval()
    right = total = 0
    with torch.no_grad():
        for batch in datamodule.test_dataloader():
            labels = batch.pop("labels")
            right += int((model(**batch).logits.argmax(-1) == labels).sum())
            total += len(labels)
    return right / max(total, 1)


def laptrain_arm(job: Any) -> dict[str, Any]:
    import lightning.pytorch as pl

    from laptrain.commands.bench import job_callbacks, make_trainer

    class EpochClock(pl.Callback):
        def on_train_epoch_start(self, *args: Any) -> None:
            self.start = time.perf_counter()

        def on_train_epoch_end(self, *args: Any) -> None:
            self.seconds = time.perf_counter() - self.start

    clock = EpochClock()
    trainer = make_trainer(job, -1, [clock, *job_callbacks(job)], epochs=1)
    trainer.fit(job.model, datamodule=job.datamodule)
    real, computed = job.datamodule.token_count("train")
    return {"seconds": clock.seconds, "real": real, "computed": computed}


def hf_arm(job: Any, grouped: bool, folder: Path, seed: int) -> dict[str, Any]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    dm = job.datamodule
    train = dm.splits["train"].remove_columns(
        [c for c in dm.splits["train"].column_names if c not in ("input_ids", "labels", "length")]
    )
    batch = int(job.plan.loader_batch)
    steps = math.ceil(len(train) / batch)
    module = job.model
    extra = {"train_sampling_strategy": "group_by_length"} if grouped else {}
    args = TrainingArguments(
        output_dir=str(folder / "hf"),
        per_device_train_batch_size=batch,
        num_train_epochs=1,
        learning_rate=float(job.cfg.model.optimizer.lr),
        weight_decay=float(job.cfg.model.optimizer.weight_decay),
        warmup_steps=int(steps * float(job.cfg.model.warmup_ratio)),
        lr_scheduler_type="linear",
        seed=seed,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        length_column_name="length",
        **extra,
    )

    class EpochClock(TrainerCallback):
        def on_epoch_begin(self, *args: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_epoch_end(self, *args: Any, **kwargs: Any) -> None:
            self.seconds = time.perf_counter() - self.start

    clock = EpochClock()
    trainer = Trainer(
        model=module.model,
        args=args,
        train_dataset=train,
        processing_class=dm.tokenizer,
        callbacks=[clock],
    )
    trainer.train()
    real = computed = 0
    for b in trainer.get_train_dataloader():  # another epoch's order, the same batching
        real += int(b["attention_mask"].sum())
        computed += b["attention_mask"].numel()
    return {"seconds": clock.seconds, "real": real, "computed": computed}


def child(arm: str, csv: str, seed: int, folder: str, overrides: list[str]) -> None:
    from laptrain.commands.bench import build_job

    argv = ["data=text_csv", f"data.files.train={csv}", f"seed={seed}", *overrides]
    if arm != "laptrain":  # HF trains the model as transformers builds it (no first-token layer)
        argv.append("model.last_layer_first_token=false")
    job = build_job(argv, Path(folder), lambda _: None)
    if arm == "laptrain":
        result = laptrain_arm(job)
    else:
        result = hf_arm(job, arm == "HF group_by_length", Path(folder), seed)
    result["samples"] = len(job.datamodule.splits["train"])
    result["accuracy"] = test_accuracy(job.model.model, job.datamodule)
    result["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("RESULT " + json.dumps(result))


def run_child(arm: str, csv: Path, seed: int, folder: Path, overrides: list[str]) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, __file__, "--child", arm, str(csv), str(seed), str(folder), *overrides],
        env={**os.environ, "LAPTRAIN_CACHE": str(csv.parent / "cache")},
        capture_output=True,
        text=True,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"{arm} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        arm, csv, seed, folder, *overrides = sys.argv[2:]
        child(arm, csv, int(seed), folder, overrides)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("overrides", nargs="*", help="train.py overrides")
    args = parser.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    overrides = ["hardware=cpu", "data.max_length=256", *args.overrides]
    results: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="laptrain-vs-hf-") as tmp:
        csv = write_longtail_csv(Path(tmp) / "longtail.csv", args.rows)
        for i, seed in enumerate(args.seeds):
            for arm in ARMS[i % 3 :] + ARMS[: i % 3]:  # each arm first once: no order bias
                folder = Path(tmp) / f"{arm.replace(' ', '_')}-{seed}"
                results[arm].append(run_child(arm, csv, seed, folder, overrides))
    from arms import machine_line

    print(machine_line())
    print(
        f"{args.rows} rows (long-tailed, benchmarks/longtail.py), "
        f"{' '.join(overrides)}, one epoch, seeds {args.seeds}, arms alternating (order rotated "
        "per seed); medians\n"
    )
    print(
        "| arm | samples/s | laptrain ÷ arm | real ÷ computed tokens | peak RSS GiB | "
        "test accuracy (min-max over seeds) |"
    )
    print("|---|---|---|---|---|---|")
    speed = {arm: [r["samples"] / r["seconds"] for r in rs] for arm, rs in results.items()}
    for arm, rs in results.items():
        ratio = statistics.median(a / b for a, b in zip(speed["laptrain"], speed[arm]))
        goal = f" (goal >= {GOALS[arm]})" if arm in GOALS else ""
        acc = [r["accuracy"] for r in rs]
        print(
            f"| {arm} | {statistics.median(speed[arm]):.1f} | {ratio:.2f}{goal} | "
            f"{statistics.median(r['real'] / r['computed'] for r in rs):.2f} | "
            f"{statistics.median(r['rss'] for r in rs) / 2**30:.2f} | "
            f"{statistics.median(acc):.3f} ({min(acc):.3f}-{max(acc):.3f}) |"
        )


if __name__ == "__main__":
    main()
