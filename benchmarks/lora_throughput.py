"""LoRA training throughput: laptrain's CausalLMLoRAModule through ``Trainer.fit`` vs a bare
peft + torch loop, and a memory preflight table for Llama 3.2 3B.

    python benchmarks/lora_throughput.py                 # throughput table (about 3 min on 2 cores)
    python benchmarks/lora_throughput.py --repeats 7 --steps 40
    python benchmarks/lora_throughput.py --preflight     # Llama 3.2 3B estimates (about 1 min)

Throughput: the same tiny Llama (random init, seed 0; 4 layers x 256 wide by default), LoRA r 8 on
all linear layers, the same batches in the same order (half prompt, half response tokens), AdamW
with the same settings, gradient checkpointing off and on. Each arm runs in a fresh process (so
its peak RSS is its own), arms interleaved laptrain, bare, laptrain, bare within each repeat; the
table gives medians over repeats. laptrain runs with its default callbacks (conf/callbacks/
default.yaml) except the progress bar, and TensorBoard logging every 10 steps; the first ``--warmup`` steps are not timed.
tokens/s counts every input token of the timed steps (prompt and response). The ratio's goal is
>= 0.95.

Preflight: the code of ``laptrain preflight`` (laptrain.families.lora.sizing) on a LlamaConfig:
parameter counts on the meta device (nothing downloaded), LoRA r 16 on all linear layers, gradient
checkpointing on. Activations are measured on a 2-layer
full-width copy on CPU at short lengths (laptrain.preflight.activations, fitted per length and
extrapolated), the per-layer part scaled to 28 layers; the sum follows laptrain.preflight.estimate
(device calibration, allocator slack). Apple budgets are 0.65 x the MPS recommended maximum, taken
as 75 % of RAM. Every figure of that table is an estimate, none is measured on a Mac.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import torch

from laptrain.families.lora.sizing import LLAMA32_3B
from laptrain.families.lora.tiny_llama import masked_token_batches

ROOT = Path(__file__).resolve().parents[1]
GB = 1e9  # decimal GB, as RAM sizes are quoted
VOCAB = 2048  # the offline tokenizer's size


def llama_fields(hidden: int, layers: int) -> dict[str, Any]:
    return {
        "vocab_size": VOCAB,
        "hidden_size": hidden,
        "intermediate_size": 3 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": max(1, hidden // 64),
        "num_key_value_heads": max(1, hidden // 128),
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    }


def masked_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the response tokens (the module's loss with one micro batch)."""
    shifted = labels[:, 1:]
    keep = shifted != -100
    picked = logits[:, :-1][keep].float()
    return torch.nn.functional.cross_entropy(picked, shifted[keep], reduction="sum") / keep.sum()


LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}
LR = 1e-4


def run_bare(args: argparse.Namespace, batches: list[dict[str, torch.Tensor]]) -> list[float]:
    """peft + torch: forward, masked loss, backward, AdamW step; returns step-end times."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**llama_fields(args.hidden, args.layers)))
    base.config.use_cache = False
    if args.ckpt:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        base.enable_input_require_grads()
    config = LoraConfig(
        r=LORA["r"],
        lora_alpha=LORA["alpha"],
        lora_dropout=LORA["dropout"],
        target_modules=LORA["target_modules"],
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, config, autocast_adapter_dtype=True)
    model.train()
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0
    )
    ends, losses = [], []
    for batch in batches:
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
        ).logits
        loss = masked_loss(logits, batch["labels"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        ends.append(time.perf_counter())
    args.final_loss = losses[-1]
    return ends


class Batches:
    """The prepared batches as a loader (a plain list would read as a list of loaders)."""

    def __init__(self, batches: list[dict[str, torch.Tensor]]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)


def default_callbacks(folder: Path) -> list[Any]:
    """conf/callbacks/default.yaml as train.py builds it (hardware=cpu), without the progress bar."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import instantiate
    from omegaconf import DictConfig, open_dict

    from laptrain.run_folder.naming import register_resolvers

    register_resolvers()
    overrides = ["hardware=cpu", "model=tiny_llama_lora", "data=stdlib_instructions"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(folder)
    return [
        instantiate(c, _convert_="all")
        for name, c in cfg.callbacks.items()
        if isinstance(c, DictConfig) and "_target_" in c and name != "progress_bar"
    ]


def run_laptrain(args: argparse.Namespace, batches: list[dict[str, torch.Tensor]]) -> list[float]:
    """CausalLMLoRAModule through Trainer.fit with laptrain's callbacks; returns step-end times."""
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import TensorBoardLogger

    from laptrain.families.lora.causal_lm import CausalLMLoRAModule

    ends: list[float] = []
    losses: list[float] = []

    class StepEnds(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            ends.append(time.perf_counter())
            losses.append(float(outputs["loss"]))

    torch.manual_seed(0)
    module = CausalLMLoRAModule(
        backbone={"model_type": "llama", **llama_fields(args.hidden, args.layers)},
        lora=LORA,
        gradient_checkpointing=bool(args.ckpt),
        optimizer=partial(torch.optim.AdamW, lr=LR, weight_decay=0.0),
        scheduler="constant",
        save_adapters=False,
    )
    with tempfile.TemporaryDirectory() as tmp:
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=1,
            precision="32-true",
            max_steps=len(batches),
            max_epochs=1,
            limit_val_batches=0,
            num_sanity_val_steps=0,
            log_every_n_steps=10,
            logger=TensorBoardLogger(tmp, name="tensorboard"),
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp,
            callbacks=[*default_callbacks(Path(tmp)), StepEnds()],
        )
        trainer.fit(module, train_dataloaders=Batches(batches))
    args.final_loss = losses[-1]
    return ends


def child(args: argparse.Namespace) -> None:
    """One arm in this process; prints one JSON line."""
    batches = masked_token_batches(args.warmup + args.steps, args.batch, args.seq, VOCAB, seed=1)
    rss_start = psutil.Process().memory_info().rss
    ends = (run_laptrain if args.arm == "laptrain" else run_bare)(args, batches)
    timed = ends[args.warmup - 1 :]
    seconds = timed[-1] - timed[0]
    tokens = args.steps * args.batch * args.seq
    steps = [b - a for a, b in zip(timed, timed[1:], strict=False)]
    print(
        json.dumps(
            {
                "tokens_per_s": tokens / seconds,
                "step_ms": 1000 * statistics.median(steps),
                "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "rss_start": rss_start,
                "final_loss": args.final_loss,
            }
        )
    )


def spawn(args: argparse.Namespace, arm: str, ckpt: bool) -> dict[str, float]:
    command = [
        sys.executable,
        __file__,
        "--child",
        arm,
        "--ckpt",
        str(int(ckpt)),
        *("--steps", str(args.steps), "--warmup", str(args.warmup)),
        *("--hidden", str(args.hidden), "--layers", str(args.layers)),
        *("--batch", str(args.batch), "--seq", str(args.seq)),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"{arm} (checkpointing {ckpt}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"machine: {cpu}, {os.cpu_count()} logical cores, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, Python {platform.python_version()}, load average {load}"
    )


def throughput(args: argparse.Namespace) -> None:
    print(machine_line())
    print(
        f"model: Llama {args.layers} layers x {args.hidden} wide, vocab {VOCAB}, LoRA r {LORA['r']} "
        f"all-linear; batch {args.batch} x {args.seq} tokens; {args.warmup} warm-up + "
        f"{args.steps} timed steps; {args.repeats} repeats, arms interleaved\n"
    )
    results: dict[tuple[str, bool], list[dict[str, float]]] = {}
    for repeat in range(args.repeats):
        for ckpt in (False, True):
            for arm in ("laptrain", "bare"):
                results.setdefault((arm, ckpt), []).append(spawn(args, arm, ckpt))
        print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr, flush=True)

    def med(arm: str, ckpt: bool, key: str) -> float:
        return statistics.median(r[key] for r in results[arm, ckpt])

    print("| checkpointing | laptrain tokens/s | bare tokens/s | ratio (goal >= 0.95) |")
    print("|---|---:|---:|---:|")
    for ckpt in (False, True):
        ratios = [
            a["tokens_per_s"] / b["tokens_per_s"]
            for a, b in zip(results["laptrain", ckpt], results["bare", ckpt], strict=True)
        ]
        lap, bare = med("laptrain", ckpt, "tokens_per_s"), med("bare", ckpt, "tokens_per_s")
        spread = f"{min(ratios):.3f}-{max(ratios):.3f}"
        print(
            f"| {'on' if ckpt else 'off'} | {lap:,.0f} | {bare:,.0f} | {lap / bare:.3f} "
            f"(per repeat {spread}) |"
        )
    print("\n| arm | step ms off | step ms on | checkpointing cost | peak RSS off | peak RSS on |")
    print("|---|---:|---:|---:|---:|---:|")
    for arm in ("laptrain", "bare"):
        off, on = med(arm, False, "step_ms"), med(arm, True, "step_ms")
        rss = [med(arm, c, "peak_rss") / GB for c in (False, True)]
        print(
            f"| {arm} | {off:.1f} | {on:.1f} | {100 * (on / off - 1):+.0f}% time | "
            f"{rss[0]:.2f} GB | {rss[1]:.2f} GB |"
        )
    print("\n| arm | final loss off | final loss on |")
    print("|---|---:|---:|")
    for arm in ("laptrain", "bare"):
        print(
            f"| {arm} | {med(arm, False, 'final_loss'):.6f} | {med(arm, True, 'final_loss'):.6f} |"
        )
    print(
        "\npeak RSS: the process high-water mark (ru_maxrss), imports included (laptrain's arm "
        "also imports Lightning and Hydra)."
    )


# ---- preflight table ------------------------------------------------------------------------

APPLE_RAM_GB = (16, 24, 32)
MPS_RECOMMENDED = 0.75  # the MPS recommended maximum working set, as a share of RAM (approximate)
BUDGET_FRACTION = 0.65  # laptrain's Apple profiles: memory_fraction 0.65 of that maximum
LENGTHS = (512, 1024, 2048)


def preflight(args: argparse.Namespace) -> None:
    from transformers import LlamaConfig

    from laptrain.families.lora.sizing import (
        count_lora,
        lora_estimate,
        measure_lora_activations,
    )

    r, layers = 16, LLAMA32_3B["num_hidden_layers"]
    config = LlamaConfig(**LLAMA32_3B)
    lora = {"r": r, "alpha": 2 * r, "target_modules": "all-linear"}
    counts = count_lora(config, lora)
    params, trainable = counts.params, counts.trainable

    # Activations: a 2-layer copy at full width on CPU with checkpointing on, measured at short
    # lengths and fitted; the per-layer part is scaled from 2 to 28 layers (laptrain preflight's
    # own code, laptrain.families.lora.sizing).
    start = time.perf_counter()
    profile = measure_lora_activations(config, lora, args.preflight_seq)
    measured_s = time.perf_counter() - start

    print(machine_line())
    print(
        f"Llama 3.2 3B (hidden 3072, 28 layers, 24 heads / 8 KV, intermediate 8192, vocab 128256, "
        f"tied embeddings): {params / 1e9:.3f} B parameters with LoRA r {r} all-linear, "
        f"{trainable / 1e6:.1f} M trainable (counted on the meta device). Activations measured on "
        f"a 2-layer full-width copy on CPU at {max(8, args.preflight_seq // 4)}-"
        f"{3 * max(8, args.preflight_seq // 4)} tokens in {measured_s:.0f} s, extrapolated to "
        f"{layers} layers and 512-2048 tokens. ALL FIGURES ARE ESTIMATES (GB, micro batch 1, "
        "gradient checkpointing on, AdamW fp32 on the adapters; bf16 rows halve base weights and "
        "activations).\n"
    )
    budgets = {ram: BUDGET_FRACTION * MPS_RECOMMENDED * ram for ram in APPLE_RAM_GB}
    header = " | ".join(f"{ram} GB Mac (budget {b:.1f})" for ram, b in budgets.items())
    print(f"| base | tokens | estimate (weights + adapters/grads/AdamW + activations) | {header} |")
    print("|---|---:|---|" + "---|" * len(budgets))
    for dtype, width in (("fp32", 4), ("bf16", 2)):
        for seq in LENGTHS:
            est = lora_estimate(
                counts, profile, seq, width, "mps", vocab=int(LLAMA32_3B["vocab_size"])
            )
            total = est.total
            cells = " | ".join(
                f"~{total / GB:.1f} est. {'fits' if total <= b * GB else 'over'}"
                for b in budgets.values()
            )
            acts = (est.activations + est.transient) / GB
            print(
                f"| {dtype} | {seq} | ~{total / GB:.1f} GB est. (base "
                f"{(params - trainable) * width / GB:.2f}, "
                f"adapters+grads+AdamW {(est.grads + est.optimizer + trainable * 4) / GB:.2f}, "
                f"activations ~{acts:.2f}, slack ~{est.overhead / GB:.2f}) | {cells} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--preflight", action="store_true", help="print the Llama 3.2 3B table")
    parser.add_argument("--preflight-seq", type=int, default=32, help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=["laptrain", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--ckpt", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.arm = args.child
        child(args)
    elif args.preflight:
        preflight(args)
    else:
        throughput(args)


if __name__ == "__main__":
    main()
