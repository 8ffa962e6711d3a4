"""Where a LoRA run keeps its adapter: the one place the CLI's tools and ``model.init_adapters``
look for it."""

from __future__ import annotations

from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"


def find_adapter(path: str | Path) -> Path:
    """The adapter folder for ``path``: itself, its ``adapter/`` or ``model/``, or the newest
    ``adapters/step-*``. Raises a one-line ValueError when there is none."""
    path = Path(path)
    for candidate in (path, path / "adapter", path / "model"):
        if (candidate / ADAPTER_CONFIG).is_file():
            return candidate
    steps = sorted(p for p in (path / "adapters").glob("step-*") if (p / ADAPTER_CONFIG).is_file())
    if steps:
        return steps[-1]
    raise ValueError(
        f"no {ADAPTER_CONFIG} in {path} (nor in its adapter/ or adapters/step-*/): point at a LoRA "
        "run folder or an adapter folder written by training"
    )
