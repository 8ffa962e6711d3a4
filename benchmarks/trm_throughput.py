"""TRM throughput on this machine: presets x mixers x micro-batch, compile and checkpointing.

One measured step = one supervision step (forward, backward, AdamW) of ``micro`` puzzles, as in
training. Prints a markdown table measured side by side in one run, next to field note 002's
unsourced samples/s claims (docs/field_notes.md), and the step-time ratio of the LightningModule to
a bare loop (goal <= 1.03).

    python benchmarks/trm_throughput.py                       # the full grid (slow for big presets)
    python benchmarks/trm_throughput.py --sizes tiny ram_8gb --micro 8 64 --steps 3
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import time
from pathlib import Path

import lightning.pytorch as pl
import psutil
import torch
import yaml

from laptrain.families.trm import TRMSudokuModule
from laptrain.families.trm.loss import halt_loss, per_puzzle_answer_loss

SIZES = yaml.safe_load((Path(__file__).parents[1] / "conf/model/trm_sudoku.yaml").read_text())[
    "sizes"
]
# field note 002, unsourced
SEED_CLAIMS = {"ram_8gb": "5-15", "ram_16gb": "15-30", "ram_32gb": "25-50"}


def make(size: str, mixer: str, compile_: bool, checkpoint: bool) -> TRMSudokuModule:
    preset = {
        **SIZES[size],
        "mixer": mixer,
        "positions": "rope" if mixer == "attention" else "none",
    }
    torch.manual_seed(0)
    return TRMSudokuModule(
        vocab_size=11,
        seq_len=81,
        size=size,
        sizes={size: preset},
        compile=compile_,
        grad_checkpoint=checkpoint,
    )


def saved_activation_bytes(module: TRMSudokuModule, micro: int) -> int:
    """Bytes of tensors autograd keeps for backward in one supervision step."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    inputs = torch.randint(1, 11, (micro, 81))
    y, z = module.model.initial_states(micro)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module.supervision_step(inputs, y, z).logits.sum().backward()
    module.zero_grad(set_to_none=True)
    return total


def bare_step_times(module: TRMSudokuModule, micro: int, steps: int) -> list[float]:
    """The same network, loss and optimizer in a plain PyTorch loop."""
    opt = torch.optim.AdamW(module.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    inputs = torch.randint(1, 11, (micro, 81))
    labels = torch.randint(2, 11, (micro, 81))
    y, z = module.model.initial_states(micro)
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = module.supervision_step(inputs, y, z)
        solved = (out.logits.argmax(-1) == labels).all(-1)
        answer = per_puzzle_answer_loss(out.logits, labels, module.loss_kind)
        ((answer.sum() + 0.5 * halt_loss(out.halt_logit, solved).sum()) / micro).backward()
        opt.step()
        y, z = out.y, out.z
        times.append(time.perf_counter() - start)
    return times[1:]  # the first step pays one-time costs (compile, allocator)


class RepeatBatch:
    """The same batch ``n`` times (a plain list would be read as a list of dataloaders)."""

    def __init__(self, batch: dict[str, torch.Tensor], n: int) -> None:
        self.batch, self.n = batch, n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter([self.batch] * self.n)


class StepTimer(pl.Callback):
    def __init__(self) -> None:
        self.times: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.times.append(time.perf_counter() - self._start)


def lightning_step_times(module: TRMSudokuModule, micro: int, steps: int) -> list[float]:
    inputs = torch.randint(1, 11, (micro, 81))
    labels = torch.randint(2, 11, (micro, 81))
    loader = RepeatBatch({"inputs": inputs, "labels": labels}, steps + 1)
    timer = StepTimer()
    trainer = pl.Trainer(
        max_steps=steps + 1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
    )
    module.configure_callbacks = lambda: []  # EMA is a separate cost; compare the same work
    trainer.fit(module, train_dataloaders=loader)
    return timer.times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", nargs="+", default=["tiny", "ram_8gb", "ram_16gb", "ram_32gb", "paper"]
    )
    parser.add_argument("--mixers", nargs="+", default=["mlp", "attention"])
    parser.add_argument("--micro", nargs="+", type=int, default=[8, 32])
    parser.add_argument(
        "--steps", type=int, default=3, help="timed steps per row (after 1 warm-up)"
    )
    parser.add_argument("--compile", action="store_true", help="also time torch.compile rows")
    parser.add_argument("--overhead-steps", type=int, default=20, help="0 skips the overhead run")
    args = parser.parse_args()

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load {os.getloadavg()[0]:.1f}, RAM {psutil.virtual_memory().total / 1e9:.0f} GB\n"
    )
    print(
        "| size | mixer | params | micro | compile | ckpt | step s (median) | samples/s | "
        "puzzles/s (no halting) | saved activations MB | field note 002 claim |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    variants = [(False, False), (False, True)] + ([(True, False)] if args.compile else [])
    for size in args.sizes:
        for mixer in args.mixers:
            for micro in args.micro:
                for compile_, ckpt in variants:
                    module = make(size, mixer, compile_, ckpt)
                    params = sum(p.numel() for p in module.parameters())
                    activations = saved_activation_bytes(module, micro) / 1e6
                    step = statistics.median(bare_step_times(module, micro, args.steps))
                    print(
                        f"| {size} | {mixer} | {params / 1e6:.2f}M | {micro} | {compile_} | {ckpt} "
                        f"| {step:.3f} | {micro / step:.1f} | {micro / step / module.n_sup:.2f} "
                        f"| {activations:.0f} | {SEED_CLAIMS.get(size, '-')} |",
                        flush=True,
                    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux -> GB
    print(f"\npeak RSS of this process: {peak:.2f} GB")

    if not args.overhead_steps:
        return
    bare = statistics.median(
        bare_step_times(make("tiny", "mlp", False, False), 64, args.overhead_steps)
    )
    lit = statistics.median(
        lightning_step_times(make("tiny", "mlp", False, False), 64, args.overhead_steps)
    )
    print(
        f"\ntiny, batch 64: LightningModule step {lit:.3f} s vs bare loop {bare:.3f} s -> "
        f"ratio {lit / bare:.3f} (goal <= 1.03; load {os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    main()
