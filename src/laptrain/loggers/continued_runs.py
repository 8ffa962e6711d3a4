"""A resumed run continues its MLflow run and its W&B run instead of starting a second one.

Lightning's loggers start a new run without an id: the ids are kept in ``tracking.json`` and passed
back (``MLFlowLogger(run_id=...)``, ``WandbLogger(id=..., resume="allow")``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from laptrain.config.secrets import without_login
from laptrain.files import write_text_atomic

TRACKING_FILE = "tracking.json"


def entries(section: Any) -> Iterator[tuple[str, DictConfig]]:
    """``(name, node)`` of each logger the job builds, in the order it builds them."""
    if not section:
        return
    for name, node in section.items():
        if isinstance(node, DictConfig) and "_target_" in node:
            yield str(name), node


def kind_of(node: Mapping[str, Any]) -> str | None:
    """``"mlflow"`` or ``"wandb"`` for a node whose ``_target_`` is (a subclass of) Lightning's
    MLFlowLogger or WandbLogger, else None."""
    from hydra.utils import get_class
    from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

    try:
        cls = get_class(str(node["_target_"]))
    except Exception:  # not a class, or not importable: Hydra's own error comes when it is built
        return None
    if issubclass(cls, MLFlowLogger):
        return "mlflow"
    if issubclass(cls, WandbLogger):
        return "wandb"
    return None


def stored(folder: Path) -> dict[str, dict[str, Any]]:
    """What ``tracking.json`` holds (nothing when the run folder never started a tracked run)."""
    try:
        found = json.loads((folder / TRACKING_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return (
        {k: v for k, v in found.items() if isinstance(v, dict)} if isinstance(found, dict) else {}
    )


def with_stored_ids(section: DictConfig, folder: Path) -> None:
    """Fill ``run_id`` (MLflow) and ``id`` (W&B) of ``section``'s tracked loggers from the run
    folder's ``tracking.json``, where the config leaves them null."""
    ids = stored(folder)
    for name, node in entries(section):
        kind, kept = kind_of(node), ids.get(name, {})
        if kind == "mlflow" and node.get("run_id") is None and kept.get("run_id"):
            if kept.get("tracking_uri") == _resolved(node, "tracking_uri"):
                with open_dict(node):
                    node.run_id = kept["run_id"]
        elif kind == "wandb" and node.get("id") is None and kept.get("id"):
            with open_dict(node):
                node.id = kept["id"]


def remember(section: Any, loggers: list[Any], folder: Path) -> None:
    """Write the ids of the tracked runs ``loggers`` started (built from ``section``) into
    ``tracking.json``; call it on rank 0 once the runs exist (after the first hyperparameters)."""
    ids = stored(folder)
    before = dict(ids)
    for (name, node), logger in zip(entries(section), loggers):
        kind = kind_of(node)
        if kind == "mlflow" and logger.run_id:
            ids[name] = {"run_id": logger.run_id, "tracking_uri": _resolved(node, "tracking_uri")}
        elif kind == "wandb" and _real_wandb_run(logger):
            ids[name] = {"id": logger.experiment.id, "project": logger.name}
    if ids != before:
        write_text_atomic(folder / TRACKING_FILE, json.dumps(ids, indent=1))


def _resolved(node: DictConfig, key: str) -> Any:
    value = OmegaConf.select(node, key, default=None)
    return without_login(str(value)) if value is not None else None


def _real_wandb_run(logger: Any) -> bool:
    """Whether the logger's run is one W&B keeps (not ``mode="disabled"``, whose id means nothing)."""
    run = logger.experiment
    return bool(getattr(run, "id", None)) and not getattr(run, "disabled", False)
