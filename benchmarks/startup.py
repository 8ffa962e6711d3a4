"""Time from ``python train.py`` to the first optimizer step, and where it goes.

Each run is a fresh process that executes train.py as ``python train.py`` would (via runpy), with
timers wrapped around the steps train.py and laptrain.job.run take in order: hardware detection,
composition, the data-file check, the config check (which imports torch, Lightning and each
``_target_``), the device check, then in ``build``: the data module, its ``prepare_data`` and
``setup`` (reading the data, training or loading the tokenizer, the tokenized cache), the model,
the run plan (preflight), then the Trainer, and ``fit`` up to the first optimizer step, where the
process ends. What no timer covers (interpreter start, module imports, Hydra's run folder and
logging) is "other". The first run warms the caches and is not counted; the table gives the
median of ``--runs`` warm runs.

    python benchmarks/startup.py [--runs 3] [train.py overrides ...]
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 4.0  # issue 52: <= 4 s on 2 cores with a warm cache


def child(marks_file: str, argv: list[str]) -> None:
    """Run train.py in this process with timers; write the phases when the first step starts."""
    phases: list[tuple[str, float, float]] = []

    def timed(fn: Any, label: str) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            start = time.time()
            try:
                return fn(*args, **kwargs)
            finally:
                phases.append((label, start, time.time()))

        return wrapped

    def patch(module: Any, name: str, label: str) -> None:
        setattr(module, name, timed(getattr(module, name), label))

    import laptrain.config.check as config_check
    import laptrain.data.precheck as precheck
    import laptrain.hardware.auto as auto

    patch(auto, "resolve_hardware_argv", "hardware detection")
    patch(config_check, "compose_argv", "composition (Hydra)")
    patch(precheck, "check_data_config", "data file check")
    check_composed = config_check.check_composed

    def after_imports(cfg: Any) -> None:  # torch may be imported from here on (env applied)
        start = time.time()
        check_composed(cfg)
        phases.append(("config check (imports torch, Lightning, targets)", start, time.time()))
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        import laptrain.launch.device as device

        patch(device, "check_device", "device check")
        import laptrain.job.run as run

        patch(run, "build_run_plan", "run plan (preflight)")
        instantiate = run.instantiate

        def labelled_instantiate(cfg: Any, *args: Any, **kwargs: Any) -> Any:
            target = str(cfg.get("_target_", "")) if hasattr(cfg, "get") else ""
            label = (
                "Trainer"
                if target.endswith(".Trainer")
                else "data module"
                if "data" in target
                else "model"
                if "model" in target
                else "callbacks and loggers"
            )
            start = time.time()
            made = instantiate(cfg, *args, **kwargs)
            phases.append((label, start, time.time()))
            for method in ("prepare_data", "setup"):
                if label == "data module" and hasattr(made, method):
                    setattr(made, method, timed(getattr(made, method), "data + tokenizer"))
            return made

        run.instantiate = labelled_instantiate
        fit_start: list[float] = []
        import lightning.pytorch as pl

        original_fit = pl.Trainer.fit

        def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
            fit_start.append(time.time())
            return original_fit(self, *args, **kwargs)

        pl.Trainer.fit = fit

        def first_step(optimizer: Any, args: Any, kwargs: Any) -> None:
            phases.append(("fit up to the first optimizer step", fit_start[0], time.time()))
            Path(marks_file).write_text(json.dumps({"phases": phases, "end": time.time()}))
            sys.stdout.flush()
            os._exit(0)

        register_optimizer_step_pre_hook(first_step)

    config_check.check_composed = after_imports
    sys.argv = [str(ROOT / "train.py"), *argv]
    runpy.run_path(str(ROOT / "train.py"), run_name="__main__")


def one_run(argv: list[str], cwd: Path) -> dict[str, float]:
    marks = cwd / "marks.json"
    marks.unlink(missing_ok=True)
    launched = time.time()
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(marks), *argv],
        cwd=cwd,
        env={**os.environ, "LAPTRAIN_CACHE": str(cwd / "cache")},
        capture_output=True,
        text=True,
    )
    if not marks.is_file():
        raise SystemExit(f"train.py did not reach a step (exit {done.returncode}):\n{done.stderr}")
    data = json.loads(marks.read_text())
    spent: dict[str, float] = {}
    for label, start, end in data["phases"]:
        spent[label] = spent.get(label, 0.0) + end - start
    spent["fit up to the first optimizer step"] -= sum(  # nested in fit: not counted twice
        end - start
        for label, start, end in data["phases"]
        if label == "data + tokenizer" and start >= _fit_start(data["phases"])
    )
    total = data["end"] - launched
    spent["other (interpreter, imports, Hydra run folder)"] = total - sum(spent.values())
    spent["total"] = total
    return spent


def _fit_start(phases: list[list]) -> float:
    return next(start for label, start, _ in phases if label.startswith("fit up to"))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="warm runs (after one cache warm-up)")
    parser.add_argument(
        "overrides", nargs="*", help="train.py overrides (default: the default job)"
    )
    args = parser.parse_args()
    argv = [*args.overrides, "test=false", "resume=false"]
    with tempfile.TemporaryDirectory(prefix="laptrain-startup-") as tmp:
        cold = one_run(argv, Path(tmp))
        warm = [one_run(argv, Path(tmp)) for _ in range(args.runs)]
    from arms import machine_line

    print(machine_line())
    print(
        f"job: {' '.join(args.overrides) or 'default'}; {args.runs} warm runs (median) after one "
        f"cold run ({cold['total']:.1f} s, empty cache)\n"
    )
    print("| phase | seconds | share |")
    print("|---|---|---|")
    total = statistics.median(w["total"] for w in warm)
    for label in warm[0]:
        if label == "total":
            continue
        seconds = statistics.median(w.get(label, 0.0) for w in warm)
        print(f"| {label} | {seconds:.2f} | {seconds / total:.0%} |")
    print(f"| **total to the first optimizer step** | **{total:.2f}** | goal <= {GOAL_S:g} s |")


if __name__ == "__main__":
    main()
