"""What the benchmarks share: the side-by-side ones' ``--arms`` (real_lora.py, dpo_vs_trl.py), the
tiny offline job of the LoRA-family benchmarks' ``--smoke`` and the machine line every table is
printed with."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence


def tiny_lora_smoke(experiment: str, *extra: str) -> list[str]:
    """``--smoke``'s job for a LoRA-family benchmark: the offline ``experiment`` on a base of one
    32-wide layer pretrained for 4 steps, rank-4 adapters and 10 stdlib modules of data, then
    ``extra`` overrides."""
    return [
        f"experiment={experiment}",
        "hardware=cpu",
        "model.tiny_base.hidden_size=32",
        "model.tiny_base.intermediate_size=64",
        "model.tiny_base.num_layers=1",
        "model.tiny_base.steps=4",
        "model.lora.r=4",
        "data.builder.modules=[json,csv,base64,shlex,heapq,bisect,textwrap,fnmatch,glob,copy]",
        "data.vocab_size=512",
        *extra,
    ]


def arms_option(arms: Sequence[str]) -> Callable[[str], list[str]]:
    """``--arms``' parser: a comma-separated subset of ``arms``, laptrain's always among them,
    returned in ``arms``' order."""

    def parse(text: str) -> list[str]:
        chosen = [a.strip() for a in text.split(",") if a.strip()]
        if "laptrain" not in chosen or not set(chosen) <= set(arms):
            raise argparse.ArgumentTypeError(f"--arms takes laptrain and any of {', '.join(arms)}")
        return [a for a in arms if a in chosen]

    return parse


def add_arm_options(parser: argparse.ArgumentParser, arms: Sequence[str], example: str) -> None:
    """``--arms`` (which arms run), ``--set`` (a train.py override for every arm's job, e.g.
    ``example``) and the hidden ``--child`` (one arm, run in its own process)."""
    parser.add_argument(
        "--arms", type=arms_option(arms), default=list(arms), help="comma-separated, laptrain first"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="OVERRIDE",
        help=f"a train.py override for the job of every arm, e.g. --set {example}",
    )
    parser.add_argument("--child", choices=arms, help=argparse.SUPPRESS)


def yes(met: bool) -> str:
    return "yes" if met else "NO"


def machine_line() -> str:
    """The machine and its load, printed with every table (the numbers depend on both)."""
    import platform

    import psutil
    import torch

    load = os.getloadavg()
    return (
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
