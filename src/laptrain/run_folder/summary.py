"""``laptrain runs summary <sweep folder or runs...>``: k-fold runs as each metric's mean ± std.
Runs whose configs differ only in ``data.fold`` form one group; each final metric (and the best
score) is given as mean, sample standard deviation (n-1) and count."""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from laptrain.run_folder.compare import (
    MISSING,
    _number,
    config_differences,
    flatten,
    markdown_table,
    run_label,
)
from laptrain.run_folder.listing import _yaml, is_run_folder, json_record, resolve_run

FOLD_KEY = "data.fold"


def named_runs(names: Sequence[str], root: Path) -> list[Path]:
    """Run folders: each name a run, or a folder of runs (a sweep: ``multirun/<name>``)."""
    folders: list[Path] = []
    for name in names:
        for candidate in (root / name, Path(name)):
            jobs = sorted(p for p in candidate.glob("*") if is_run_folder(p))
            if not is_run_folder(candidate) and jobs:
                folders += jobs
                break
        else:
            folders.append(resolve_run(name, root))
    return list(dict.fromkeys(folders))


def final_metrics(folder: Path) -> dict[str, float]:
    """The run's final metrics (``metrics.json``; learning rates and ``hp/`` copies left out) and
    its best checkpoint's score as ``best <monitor>``."""
    report = json_record(folder / "report.json") or {}
    final = json_record(folder / "metrics.json") or report.get("metrics") or {}
    out = {
        k: float(v)
        for k, v in final.items()
        if isinstance(v, int | float) and not k.startswith(("hp/", "lr-"))
    }
    checkpoint = report.get("checkpoint") or {}
    if isinstance(checkpoint, Mapping) and checkpoint.get("best_score") is not None:
        out[f"best {checkpoint.get('monitor')}"] = float(checkpoint["best_score"])
    return out


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Mean, sample standard deviation (n-1; None for one value) and count."""
    std = statistics.stdev(values) if len(values) > 1 else None
    return {"mean": statistics.fmean(values), "std": std, "n": len(values)}


def _config(folder: Path) -> Mapping[str, Any]:
    config = _yaml(folder / ".hydra" / "config.yaml")
    return config if isinstance(config, Mapping) else {}


def fold_groups(folders: Sequence[Path], root: Path) -> list[dict[str, Any]]:
    """The runs grouped by their config without ``data.fold``, in order of first appearance:
    ``{"runs", "folds", "config" (the keys that tell groups apart), "metrics": {name: spread}}``."""
    configs = [flatten(_config(f)) for f in folders]
    members: dict[str, list[int]] = {}
    for i, config in enumerate(configs):
        rest = {k: v for k, v in config.items() if k != FOLD_KEY}
        members.setdefault(json.dumps(rest, sort_keys=True, default=str), []).append(i)
    firsts = [configs[rows[0]] for rows in members.values()]
    differences = config_differences(
        [{k: v for k, v in c.items() if k != FOLD_KEY} for c in firsts]
    )
    groups = []
    for g, rows in enumerate(members.values()):
        finals = [final_metrics(folders[i]) for i in rows]
        names = sorted({k for f in finals for k in f})
        groups.append(
            {
                "runs": [run_label(folders[i], root) for i in rows],
                "folds": [configs[i].get(FOLD_KEY) for i in rows],
                "config": {key: values[g] for key, values in differences},
                "metrics": {n: spread([f[n] for f in finals if n in f]) for n in names},
            }
        )
    return groups


def _shown(cell: Mapping[str, Any]) -> str:
    std = MISSING if cell["std"] is None else _number(cell["std"])
    return f"{_number(cell['mean'])} ± {std}"


def summary_text(groups: Sequence[Mapping[str, Any]]) -> str:
    blocks = []
    for group in groups:
        folds = ",".join(MISSING if f is None else str(f) for f in group["folds"])
        config = ", ".join(f"{k}={v}" for k, v in group["config"].items())
        head = f"{len(group['runs'])} runs, {FOLD_KEY}={folds}" + (f" ({config})" if config else "")
        rows = [(name, [_shown(c), str(c["n"])]) for name, c in group["metrics"].items()]
        table = markdown_table(["metric", "mean ± std", "n"], rows) if rows else "(no metrics)"
        blocks.append(f"{head}\n{table}")
    return "\n\n".join(blocks)


def summary_command(names: Sequence[str], root: str | Path, as_json: bool = False) -> int:
    """Print each group's metrics as mean ± std (``--json``: one JSON document)."""
    root = Path(root)
    try:
        folders = named_runs(names, root)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    groups = fold_groups(folders, root)
    print(json.dumps({"groups": groups}, indent=1) if as_json else summary_text(groups))
    return 0
