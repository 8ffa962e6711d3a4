"""Run the four speed benchmarks one after another and print their tables.

    python benchmarks/run_all.py            # the measured sizes (about 20 min on 2 cores)
    python benchmarks/run_all.py --smoke    # each at a tiny size (a check that they run)

overhead.py (laptrain vs a plain loop, each callback's cost), vs_hf.py (vs Hugging Face's
Trainer), startup.py (time to the first optimizer step) and cache.py (a rerun's time to the first
step). Each runs in its own process, never two at once; the load average is printed with each
table, since the machine's other work shows in every number.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from longtail import write_longtail_csv

HERE = Path(__file__).resolve().parent
SCRIPTS = ("overhead.py", "vs_hf.py", "startup.py", "cache.py")
# laptrain's tiny test model (tests/conftest.py TINY): seconds, not minutes
TINY = [
    "model.backbone.hidden_size=32",
    "model.backbone.intermediate_size=64",
    "model.backbone.num_hidden_layers=1",
    "data.vocab_size=300",
]


def smoke_args(csv: Path) -> dict[str, list[str]]:
    job = [*TINY, "hardware=cpu", "data=text_csv", f"data.files.train={csv}"]
    return {
        "overhead.py": ["--steps", "3", "--repeats", "1", *job],
        "vs_hf.py": ["--rows", "200", "--seeds", "0", *TINY],
        "startup.py": ["--runs", "1", *job],
        "cache.py": ["--rows", "300", "--repeats", "1", *TINY, "hardware=cpu"],
    }


def tables(stdout: str) -> str:
    """The script's report: from its last ``machine:`` line on (progress bars come before)."""
    lines = stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("machine:")]
    return "\n".join(lines[starts[-1] :] if starts else lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="each script at a tiny size")
    parser.add_argument("--only", nargs="+", choices=SCRIPTS, default=list(SCRIPTS))
    args = parser.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="laptrain-run-all-") as tmp:
        extra = smoke_args(write_longtail_csv(Path(tmp) / "smoke.csv", 240)) if args.smoke else {}
        env = {**os.environ, "LAPTRAIN_CACHE": str(Path(tmp) / "cache")}
        for script in args.only:
            print(f"\n## {script}\n", flush=True)
            done = subprocess.run(
                [sys.executable, str(HERE / script), *extra.get(script, [])],
                capture_output=True,
                text=True,
                env=env,
                cwd=tmp,
            )
            if done.returncode:
                failed += 1
                print(f"{script} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
                continue
            print(tables(done.stdout), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
