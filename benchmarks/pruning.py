"""Trials completed per hour with and without pruning, on the same Optuna search.

Runs ``python train.py -m hparams_search=optuna <overrides> hydra.sweeper.n_trials=N`` twice, each
in a fresh folder (a new study, the same sampler seed, so the first trials propose the same
points): once without a pruner and once with ``hydra.sweeper.pruner=<name>``. Prints a markdown
table: the trials that ran to the end and those pruned, the sweep's wall time, trials per hour and
the best value found. Pruning pays when most trials are hopeless early; Optuna's MedianPruner
starts pruning after 5 trials (``n_startup_trials``), so a short search shows little.

    python benchmarks/pruning.py --trials 20 hardware=cpu model=tiny_classifier data=text_csv \\
        data.files.train=texts.csv trainer.max_epochs=5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sweep(overrides: list[str], trials: int, pruner: str | None, folder: Path) -> dict:
    """One sweep in ``folder``: its wall time and the study's trials."""
    import optuna

    args = [
        "-m",
        "hparams_search=optuna",
        *overrides,
        f"hydra.sweeper.n_trials={trials}",
        "run_name=bench",
        f"hydra.sweep.dir={folder / 'sweep'}",
        *([f"hydra.sweeper.pruner={pruner}"] if pruner else []),
    ]
    env = {**os.environ, "LAPTRAIN_CACHE": os.environ.get("LAPTRAIN_CACHE", str(folder / "cache"))}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"the sweep failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="bench", storage=f"sqlite:///{folder / 'sweep/optuna.db'}")
    states = [t.state.name for t in study.trials]
    best = study.best_value if "COMPLETE" in states else None
    return {
        "wall": wall,
        "complete": states.count("COMPLETE"),
        "pruned": states.count("PRUNED"),
        "best": best,
        "direction": study.direction.name.lower(),
    }


def table(rows: dict[str, dict]) -> str:
    lines = [
        "| pruner | trials run to the end | pruned | wall s | trials per hour | best value |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        per_hour = (r["complete"] + r["pruned"]) / r["wall"] * 3600
        best = "—" if r["best"] is None else f"{r['best']:.4g} ({r['direction']})"
        lines.append(
            f"| {name} | {r['complete']} | {r['pruned']} | {r['wall']:.1f} | {per_hour:.0f} | {best} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--trials", type=int, default=20, help="hydra.sweeper.n_trials of each sweep"
    )
    parser.add_argument("--pruner", default="median", help="an Optuna pruner by name")
    parser.add_argument("overrides", nargs="*", help="train.py overrides for every trial")
    args = parser.parse_args()
    rows = {}
    for pruner in (None, args.pruner):
        with tempfile.TemporaryDirectory() as tmp:
            rows[pruner or "none"] = sweep(args.overrides, args.trials, pruner, Path(tmp))
    print(f"{args.trials} trials per sweep, overrides: {' '.join(args.overrides) or '(none)'}\n")
    print(table(rows))


if __name__ == "__main__":
    main()
