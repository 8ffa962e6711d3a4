"""Where a LoRA run keeps its adapters, and where their exports go: the one place the CLI's tools
and ``model.init_adapters`` look for them."""

from __future__ import annotations

import re
from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"
STEP_FOLDER = re.compile(r"step-(\d+)")


def step_adapters(root: Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of the ``step-N`` adapter folders in ``root`` (a run's ``adapters/``),
    in step order; nothing else there (an export, a user's folder) is one."""
    found = []
    for folder in root.glob("step-*"):
        match = STEP_FOLDER.fullmatch(folder.name)
        if match and folder.is_dir():
            found.append((int(match.group(1)), folder))
    return sorted(found)


def find_adapter(path: str | Path) -> Path:
    """The adapter folder for ``path``: itself, its ``adapter/`` or ``model/``, or the newest
    ``adapters/step-N``. Raises a one-line ValueError when there is none."""
    path = Path(path)
    for candidate in (path, path / "adapter", path / "model"):
        if (candidate / ADAPTER_CONFIG).is_file():
            return candidate
    steps = [f for _, f in step_adapters(path / "adapters") if (f / ADAPTER_CONFIG).is_file()]
    if steps:
        return steps[-1]
    raise ValueError(
        f"no {ADAPTER_CONFIG} in {path} (nor in its adapter/ or adapters/step-*/): point at a LoRA "
        "run folder or an adapter folder written by training"
    )


def default_export_dir(adapter: Path, kind: str) -> Path:
    """Where an export of ``adapter`` goes without ``--out`` (``kind``: ``merged``, ``gguf-f16``):
    ``<run>/<kind>`` for a run's ``adapter/``, ``<run>/step-N-<kind>`` for a step adapter (never
    under ``adapters/``, whose folders training prunes), else ``<adapter>-<kind>`` beside it."""
    if adapter.name in ("adapter", "model"):
        return adapter.parent / kind
    if adapter.parent.name == "adapters":
        return adapter.parent.parent / f"{adapter.name}-{kind}"
    return adapter.with_name(f"{adapter.name}-{kind}")
