"""What a finished run reports to compare it with others: the value a sweeper optimises and a row in
TensorBoard's HPARAMS tab, which Lightning writes only when metrics come with the hyperparameters
(known only at the end). ``trainer.callback_metrics`` holds the last validation, not the best, and
nothing on a rerun of a finished run, so ``metrics.json`` answers for it."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from laptrain.checkpoints.checkpoint_io import load_state
from laptrain.checkpoints.trusted import TrustedGlobals
from laptrain.config.secrets import masked

METRICS_FILE = "metrics.json"


def hp_keys(optimized_metric: str) -> tuple[str, str, str]:
    """(``hp/best_val_<m>``, ``hp/test_<m>``, ``test/<m>``) for ``val/<m>``; a metric outside
    ``val/`` keeps its whole name, slashes turned to underscores."""
    name = optimized_metric.removeprefix("val/").replace("/", "_")
    return f"hp/best_val_{name}", f"hp/test_{name}", f"test/{optimized_metric.removeprefix('val/')}"


def best_score(
    callbacks: list[Any], monitor: str, trusted: TrustedGlobals | None = None
) -> float | None:
    """The best value the checkpoint callback that monitors ``monitor`` has seen, or None; after
    ``ddp_spawn`` (only ``best_model_path`` comes back) read from that checkpoint."""
    for callback in callbacks:
        if getattr(callback, "monitor", None) != monitor:
            continue
        score = getattr(callback, "best_model_score", None)
        path = getattr(callback, "best_model_path", "")
        if score is None and path and Path(path).is_file():
            score = _saved_best_score(Path(path), monitor, trusted)
        if score is not None and math.isfinite(float(score)):
            return float(score)
    return None


def _saved_best_score(path: Path, monitor: str, trusted: TrustedGlobals | None) -> float | None:
    state = load_state(path, trusted)
    for key, value in state.get("callbacks", {}).items():
        if "ModelCheckpoint" in str(key) and value.get("monitor") == monitor:
            score = value.get("best_model_score")
            if score is not None:
                return float(score)
    return None


def recorded_metrics(folder: Path) -> dict[str, float]:
    """The metrics a run folder recorded when it last ended (empty when it never did)."""
    try:
        return {k: float(v) for k, v in json.loads((folder / METRICS_FILE).read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def final_metrics(
    callbacks: list[Any],
    metrics: Mapping[str, float],
    optimized_metric: str,
    folder: Path,
    trusted: TrustedGlobals | None = None,
) -> dict[str, float]:
    """``metrics`` with ``hp/best_val_<m>`` and ``hp/test_<m>`` added. The best validation value
    comes from the checkpoint callback, else this run's last one; what this process did not
    measure (a rerun of a finished run measures no validation) comes from ``metrics.json``."""
    best_key, test_key, test_name = hp_keys(optimized_metric)
    out = {**recorded_metrics(folder), **metrics}
    best = best_score(callbacks, optimized_metric, trusted)
    if best is None and optimized_metric in metrics:
        best = float(metrics[optimized_metric])
    if best is not None:
        out[best_key] = best
    if test_name in metrics:
        out[test_key] = float(metrics[test_name])
    return {k: v for k, v in out.items() if math.isfinite(v)}


# Overrides that name machinery, not a choice to compare: the profile has its own column.
NOT_COMPARED = {"hardware", "hparams_search", "launcher"}


def hparams_row(
    cfg: DictConfig, overrides: list[str], exclude: list[str], model: Any, plan: Any
) -> dict[str, Any]:
    """What tells runs apart: the job's overrides, lr, batch, model size, profile and seed."""
    row: dict[str, Any] = {}
    for override in overrides:
        key, _, text = override.lstrip("+~").partition("=")
        if key in exclude or key in NOT_COMPARED or key.startswith("hydra"):
            continue
        value = OmegaConf.select(cfg, key, default=None)
        row[key] = value if isinstance(value, bool | int | float | str) else text
    lr = OmegaConf.select(cfg, "model.optimizer.lr", default=None)
    if isinstance(lr, int | float):
        row["lr"] = float(lr)
    row["micro_batch"] = int(plan.micro_batch)
    row["effective_batch"] = int(plan.effective_batch)
    row["parameters"] = int(sum(p.numel() for p in model.parameters()))
    row["profile"] = str(plan.profile)
    row["seed"] = int(cfg.seed)
    return masked(row)


def log_hparams(
    loggers: list[Any],
    cfg: DictConfig,
    model: Any,
    plan: Any,
    metrics: Mapping[str, float],
    step: int | None = None,
) -> None:
    """One HPARAMS row per TensorBoard run folder, with the ``hp/`` metrics; call it at the end of
    every run (a resumed run writes its row again, with the new values)."""
    from lightning.pytorch.loggers import TensorBoardLogger

    hp = {k: v for k, v in metrics.items() if k.startswith("hp/")}
    boards = [lg for lg in loggers if isinstance(lg, TensorBoardLogger)]
    if not hp or not boards:
        return
    from hydra.core.hydra_config import HydraConfig

    overrides, exclude = [], []
    if HydraConfig.initialized():
        hydra = HydraConfig.get()
        overrides = list(hydra.overrides.task)
        exclude = list(hydra.job.config.override_dirname.exclude_keys)
    row = hparams_row(cfg, overrides, exclude, model, plan)
    for board in boards:
        board.log_hyperparams(row, metrics=hp, step=step)
        board.finalize("success")  # flush: fit's end already closed the writer this reopened
