"""Run each model family a few steps at each precision this machine's device allows; print a table.

    python benchmarks/device_smoke.py                       # every family x precision
    python benchmarks/device_smoke.py --families trm --precisions 32-true,bf16-mixed --steps 4

Each cell builds the family's preset at tiny size (its optimizer, dropout, dtypes, checkpointing,
packing: laptrain/model/<family>/smoke.py), fits it with the guards that call the device during a
fit, saves a checkpoint, resumes it in a fresh Trainer, and predicts one batch, checking on the way
that every tensor the module and its callbacks keep follows the parameters to the device
(benchmarks/smoke_harness/placement.py). Lines under the table say what the cells ran. Cells read
``ok (seconds)``, ``refused: <reason>`` (the profile's precision rules, or the family's) or
``failed: <error>`` (tracebacks follow the table). Exit status 1 when a cell failed.
Paste the whole output into a bug report.
"""

from __future__ import annotations

import argparse
import sys

from smoke_harness.builds import SMOKE_BUILDS
from smoke_harness.cells import (
    detect_device,
    header_lines,
    legend_lines,
    markdown_table,
    run_smoke,
)


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--families", type=_csv, help=f"comma list; default all: {','.join(SMOKE_BUILDS)}"
    )
    parser.add_argument("--precisions", type=_csv, help="comma list; default: those of this device")
    parser.add_argument("--steps", type=int, default=2, help="steps before the save (and after)")
    parser.add_argument("--device", choices=("cpu", "cuda", "mps"), help="default: detected")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    kind = args.device or detect_device()
    for line in header_lines(kind):
        print(line)
    print(flush=True)
    try:
        cells = run_smoke(args.families, args.precisions, args.steps, kind, progress=_progress)
    except ValueError as err:
        parser.error(str(err))
    print(markdown_table(cells))
    print()
    for line in legend_lines(dict.fromkeys(c.family for c in cells), kind, args.steps):
        print(line)
    failed = [c for c in cells if c.status == "failed"]
    for cell in failed:
        print(f"\n### {cell.family} / {cell.precision}\n```\n{cell.trace.rstrip()}\n```")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
