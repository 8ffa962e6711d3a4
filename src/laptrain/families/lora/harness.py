"""``laptrain eval RUN --tasks T1,T2``: EleutherAI's lm-evaluation-harness on a LoRA run, adapter
on (and with ``--base`` off too, in the same load), each task's accuracy as lm-eval reports it.

Scoring is lm-eval's own (loglikelihood, no chat template) on the model in float32, so that the
same items score as ``lm_eval --model hf --model_args pretrained=<merged export>,dtype=float32``.
On MPS, whose scores can differ from the CPU's on the same items (lm-evaluation-harness#1679), the
first :data:`CROSS_CHECK_ITEMS` items of each task are scored on the CPU and on MPS first, and a
difference above :data:`CROSS_CHECK_POINTS` stops the evaluation with the task named.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from laptrain.families.lora.eval_tasks import TASKS_DIR

CROSS_CHECK_ITEMS = 50
CROSS_CHECK_POINTS = 1.0
RESULT_FILE = Path("eval") / "lm_eval.json"
REPORT_SECTION = "## Benchmarks (laptrain eval --tasks)"  # report.md's last section
Scores = dict[str, dict[str, float]]  # task -> {"adapter": acc, "base": acc}
Scorer = Callable[[int | None], Scores]


def task_manager(tasks: Sequence[str], include_path: str | None = None) -> Any:
    """lm-eval's TaskManager over laptrain's tasks and ``include_path``; lm-eval's own ~15,000
    tasks are indexed (~8 s) only when a name is not among those. An unknown name: one line with
    the closest known names."""
    try:
        from lm_eval.tasks import TaskManager
    except ImportError as err:
        raise ValueError("--tasks needs lm-eval: pip install 'laptrain[eval]'") from err
    paths = [str(TASKS_DIR)] + ([include_path] if include_path else [])
    if include_path and not Path(include_path).is_dir():
        raise ValueError(f"--include-path {include_path}: no such folder of task YAMLs")
    manager = TaskManager(include_path=paths, include_defaults=False)
    if not set(tasks) <= set(manager.all_tasks):
        manager = TaskManager(include_path=paths)
    for name in tasks:
        if name not in manager.all_tasks:
            close = difflib.get_close_matches(name, manager.all_tasks, n=5, cutoff=0.6)
            hint = f"close names: {', '.join(close)}" if close else "no close names"
            raise ValueError(
                f"--tasks {name}: lm-eval knows no such task ({hint}); a local task's YAML goes "
                "in --include-path DIR"
            )
    return manager


def accuracies(results: dict[str, Any]) -> dict[str, float]:
    """Each task's ``acc`` from ``simple_evaluate``'s results (a fraction, 0-1)."""
    found = {}
    for task, metrics in results["results"].items():
        if "acc,none" not in metrics:
            raise ValueError(
                f"--tasks {task} reports no acc (it reports {', '.join(sorted(metrics))}): "
                "use multiple-choice tasks"
            )
        found[task] = float(metrics["acc,none"])
    return found


def scorer(
    model: Any, tokenizer: Any, tasks: Sequence[str], manager: Any, base: bool, batch_size: int
) -> Scorer:
    """``score(limit)``: each task's accuracy with the adapter on (and off, ``base``), where the
    model is when called."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    def run(limit: int | None) -> dict[str, float]:
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=list(tasks),
            task_manager=manager,
            limit=limit,
            log_samples=False,
            bootstrap_iters=0,
        )
        return accuracies(results)

    def score(limit: int | None) -> Scores:
        adapter = run(limit)
        scores = {task: {"adapter": acc} for task, acc in adapter.items()}
        if base:
            with model.disable_adapter():
                for task, acc in run(limit).items():
                    scores[task]["base"] = acc
        return scores

    return score


def scores_on(device: str, model: Any, score: Scorer, limit: int | None) -> Scores:
    """Move ``model`` (loaded on the CPU) to ``device`` and score; on MPS, the CPU cross-check of
    the first items first (:func:`check_against_cpu`)."""
    if device == "mps":
        items = min(limit or CROSS_CHECK_ITEMS, CROSS_CHECK_ITEMS)
        on_cpu = score(items)
        model.to(device)
        check_against_cpu(on_cpu, score(items), device, items)
    model.to(device)
    return score(limit)


def check_against_cpu(cpu: Scores, device_scores: Scores, device: str, items: int) -> None:
    """Refuse (one line, the task named) a task whose accuracy on ``device`` differs from the
    CPU's by more than :data:`CROSS_CHECK_POINTS` on the same first ``items`` items."""
    for task, by_model in cpu.items():
        for which, acc in by_model.items():
            other = device_scores[task][which]
            if abs(other - acc) * 100 > CROSS_CHECK_POINTS:
                raise ValueError(
                    f"--tasks {task}: {which} scores {other:.1%} on {device} but {acc:.1%} on the "
                    f"CPU over the first {items} items (lm-evaluation-harness#1679); nothing "
                    "written: use --device cpu"
                )


def table(scores: Scores) -> str:
    """A markdown table of each task's accuracy, adapter vs base."""
    base = any("base" in s for s in scores.values())
    lines = ["| task | adapter | base |" if base else "| task | adapter |"]
    lines.append("|---|---:|---:|" if base else "|---|---:|")
    for task, s in scores.items():
        cells = [f"{s['adapter']:.1%}"] + ([f"{s['base']:.1%}"] if base else [])
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_scores(run: Path | None, scores: Scores, limit: int | None) -> Path | None:
    """``<run>/eval/lm_eval.json`` (an adapter folder outside a run: nothing written)."""
    from laptrain.files import write_text_atomic

    if run is None:
        return None
    out = run / RESULT_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps({"limit": limit, "tasks": scores}, indent=1) + "\n")
    report = run / "report.md"
    if report.is_file():  # the run's report gets (or replaces) its benchmark section
        kept = report.read_text().split(REPORT_SECTION)[0].rstrip("\n")
        limited = f" (first {limit} items of each task)" if limit else ""
        section = (
            f"{REPORT_SECTION}\n\nlm-evaluation-harness accuracy{limited}:\n\n{table(scores)}\n"
        )
        write_text_atomic(report, f"{kept}\n\n{section}")
    return out


def evaluate_tasks(
    path: str | Path,
    tasks: Sequence[str],
    include_path: str | None = None,
    limit: int | None = None,
    base: bool = False,
    batch_size: int = 8,
    device: str | None = None,
    probe: Any = None,
) -> Scores:
    """Each task's accuracy with the run's adapter on (and off, ``base``): task names checked
    first, then the memory check, one float32 load on the CPU, the scoring on the run's device (or
    ``device``), and the table written to ``<run>/eval/lm_eval.json``."""
    import torch

    import laptrain.families.lora.tools as tools

    adapter = tools.find_adapter(path)
    name = tools.base_name_of(adapter)
    manager = task_manager(tasks, include_path)
    plan = tools.checked_plan(tools.read_record(adapter), name, device, "float32", probe)
    model = tools.load_adapter_model(adapter, torch.float32)
    score = scorer(model, tools._load_tokenizer(adapter, name), tasks, manager, base, batch_size)
    scores = scores_on(plan.device, model, score, limit)
    write_scores(tools.run_folder_of(adapter), scores, limit)
    return scores
