"""The runs under ``outputs/``: their state, progress, best score and the command that resumes each,
read from the files a run leaves; torch is imported only to read the step of a checkpoint newer
than the report (a killed or running run)."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laptrain.checkpoints.last import run_last_checkpoint
from laptrain.config.secrets import masked_argument
from laptrain.run_folder.lock import LOCK_NAME, is_locked

# where runs are written: conf/train.yaml's hydra.run.dir, outputs/<run_name> in the working folder
RUNS_ROOT = "outputs"
# a rerun with these keys dropped continues the run instead of starting another or restarting
_START_KEYS = ("resume", "ckpt_path", "run_name", "hydra.run.dir", "hydra.sweep.dir")


def _yaml(path: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        return None


def json_record(path: Path) -> dict[str, Any] | None:
    """A run's JSON record (``report.json``, ``metrics.json``...), None when missing or
    unreadable."""
    try:
        data = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def section(record: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    """One section of a record (``report.json``'s ``checkpoint``...), empty when it has none."""
    body = (record or {}).get(name)
    return body if isinstance(body, dict) else {}


def _default_run_name(folder: Path) -> str | None:
    """``run_name`` as the run's config defines it (``model-data`` by default), from ``.hydra/``."""
    config = _yaml(folder / ".hydra" / "config.yaml") or {}
    hydra = (_yaml(folder / ".hydra" / "hydra.yaml") or {}).get("hydra", {})
    name = config.get("run_name")
    if not isinstance(name, str):
        return None

    def lookup(match: re.Match[str]) -> str:
        value: Any = hydra
        for part in match.group(1).split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return "\x00" if value is None else str(value)

    name = re.sub(r"\$\{hydra:([\w.]+)\}", lookup, name)
    return None if "\x00" in name or "${" in name else name


def resume_command(folder: str | Path) -> str | None:
    """``python train.py <overrides>`` that continues the run in ``folder`` (None without
    ``.hydra/overrides.yaml``). ``resume=false`` and ``ckpt_path`` are dropped, and ``run_name`` is
    pinned to the folder's name when the plain rerun would land elsewhere (``<name>-2``)."""
    from laptrain.console import shell_command

    folder = Path(folder)
    overrides = _yaml(folder / ".hydra" / "overrides.yaml")
    if not isinstance(overrides, list):
        return None
    hydra = (_yaml(folder / ".hydra" / "hydra.yaml") or {}).get("hydra", {})
    sweep = hydra.get("mode") == "MULTIRUN"
    kept = [
        masked_argument(str(o))
        for o in overrides
        if str(o).split("=", 1)[0].lstrip("+~") not in _START_KEYS
    ]
    named = [str(o).split("=", 1)[1] for o in overrides if str(o).split("=", 1)[0] == "run_name"]
    # a sweep job's folder is <sweep folder>/<its overrides>; the sweep folder carries the name
    home = folder.parent if sweep else folder
    wanted = named[-1] if named else _default_run_name(folder)
    if wanted != home.name:
        kept.append(f"run_name={home.name}")
    elif named:
        kept.append(f"run_name={named[-1]}")
    return shell_command(["python", "train.py", *(["-m"] if sweep else []), *kept])


@dataclass(frozen=True)
class RunState:
    """One run folder as ``laptrain runs`` shows it."""

    folder: Path
    status: str  # running, done ("done: stopped early at ..."), paused, interrupted, empty
    step: int | None
    best: str | None  # "val/acc 0.6045"
    command: str | None
    evaluated: dict[str, dict[str, float]] | None = None  # eval/lm_eval.json: task -> accuracies


def evaluations(folder: Path) -> dict[str, dict[str, float]] | None:
    """The benchmark accuracies ``laptrain eval --tasks`` wrote (``eval/lm_eval.json``), or None."""
    found = json_record(folder / "eval" / "lm_eval.json")
    return found.get("tasks") if found else None


def evaluation_text(evaluated: dict[str, dict[str, float]] | None) -> str:
    """``stdlib_mc 5.0 % (base 2.5 %)`` per task, for the table; empty without any."""
    return ", ".join(
        f"{task} {s['adapter']:.1%}" + (f" (base {s['base']:.1%})" if "base" in s else "")
        for task, s in (evaluated or {}).items()
    )


def _status(folder: Path, report: dict[str, Any] | None, has_ckpt: bool) -> str:
    if is_locked(folder):
        return "running"
    said = str(((report or {}).get("run") or {}).get("status", ""))
    if said.startswith("finished"):  # "finished: stopped early at epoch 5 (...)" too
        return "done" + said.removeprefix("finished")
    if said.startswith("stopped"):
        return "paused"
    if said.startswith("interrupted") or has_ckpt or report is not None:
        return "interrupted"  # a report left mid-run, or a run killed before any report
    return "empty"


def checkpoint_facts(path: Path) -> tuple[int, str | None]:
    """(global step, best score text) stored in a Lightning checkpoint (tensors memory-mapped)."""
    from laptrain.checkpoints.checkpoint_io import load_state  # imports torch

    state = load_state(path)
    best = None
    for key, value in (state.get("callbacks") or {}).items():
        if isinstance(value, dict) and value.get("best_model_score") is not None:
            monitor = re.search(r"'monitor': '([^']+)'", str(key))
            name = monitor.group(1) if monitor else "best"
            best = f"{name} {float(value['best_model_score']):.4g}"
            break
    return int(state.get("global_step", 0)), best


def run_state(folder: str | Path) -> RunState:
    """The state of one run folder, from its report when that is up to date, else its checkpoint."""
    folder = Path(folder)
    report = json_record(folder / "report.json")
    last = run_last_checkpoint(folder)
    step: int | None = None
    best: str | None = None
    if report:
        step = (report.get("run") or {}).get("global_step")
        ckpt = report.get("checkpoint") or {}
        if ckpt.get("best_score") is not None:
            best = f"{ckpt.get('monitor')} {float(ckpt['best_score']):.4g}"
    stale = last.is_file() and (
        report is None or last.stat().st_mtime > (folder / "report.json").stat().st_mtime
    )
    if stale or (best is None and last.is_file()):  # a report from before it named the best
        try:
            step, from_ckpt = checkpoint_facts(last)
            best = from_ckpt or best
        except Exception:  # noqa: BLE001 - a half-written or foreign file: show what the report says
            pass
    status = _status(folder, report, last.is_file())
    return RunState(folder, status, step, best, resume_command(folder), evaluations(folder))


def is_run_folder(folder: Path) -> bool:
    """A folder a run left: it holds ``.hydra/``, ``checkpoints/``, ``report.json`` or the lock."""
    return folder.is_dir() and any(
        (folder / name).exists() for name in (".hydra", "checkpoints", "report.json", LOCK_NAME)
    )


def resolve_run(name: str | Path, root: str | Path = RUNS_ROOT, any_folder: bool = False) -> Path:
    """The run folder ``name`` names: the one resolver of every command that takes a run.

    ``name`` as ``laptrain runs`` prints it, else a run folder's path (with ``any_folder`` any
    folder); else a one-line ValueError naming the closest runs."""
    for candidate in (Path(root) / name, Path(name)):
        if is_run_folder(candidate):
            return candidate
    if any_folder and Path(name).is_dir():
        return Path(name)
    names = run_names(root)
    close = difflib.get_close_matches(str(name), names, n=3, cutoff=0.5)
    known = (
        f"closest: {', '.join(close)}; `laptrain runs --root {root}` lists them"
        if close
        else f"`laptrain runs --root {root}` lists the {len(names)} there"
        if names
        else "there are none there yet (`laptrain runs` lists them)"
    )
    raise ValueError(
        f"no run folder {name}: neither a run under {root}/ nor a path to one ({known})"
    )


def run_names(root: str | Path = RUNS_ROOT) -> list[str]:
    """The names of the runs under ``root``, as ``laptrain runs`` prints them."""
    root = Path(root)
    return [folder.relative_to(root).as_posix() for folder in find_runs(root)]


def find_runs(root: str | Path = RUNS_ROOT) -> list[Path]:
    """Run folders under ``root``: ``<root>/<run>/`` and sweep jobs ``<root>/multirun/<sweep>/<job>/``."""
    root = Path(root)
    runs = [p for p in sorted(root.glob("*")) if p.name != "multirun" and is_run_folder(p)]
    runs += [p for p in sorted(root.glob("multirun/*/*")) if is_run_folder(p)]
    return runs


def runs_table(states: list[RunState], root: Path) -> str:
    """A plain text table, one run per row."""
    header = ("run", "status", "step", "best", "command (rerun resumes)")
    rows = [
        (
            str(s.folder.relative_to(root)) if s.folder.is_relative_to(root) else str(s.folder),
            s.status,
            "—" if s.step is None else str(s.step),
            "; ".join(filter(None, [s.best, evaluation_text(s.evaluated)])) or "—",
            s.command or "—",
        )
        for s in states
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join([*(c.ljust(w) for c, w in zip(r, widths)), r[-1]]).rstrip()
        for r in [header, *rows]
    )
