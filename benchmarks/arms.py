"""What the side-by-side benchmarks (real_lora.py, dpo_vs_trl.py) share about their arms."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence


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
