"""Where laptrain's repository is: ``conf/`` and ``train.py`` live in the user's clone, not the
package. An editable install keeps the package inside the clone; otherwise the clone is found from
the working directory, or one line says what to do. No torch import (read before torch loads)."""

from __future__ import annotations

import os
from pathlib import Path

MARKER = Path("conf") / "train.yaml"


class ProjectNotFound(ValueError):
    """Neither the package's source tree nor the working directory is a laptrain clone."""


def project_root(cwd: Path | None = None) -> Path:
    """The laptrain clone: the one holding this package (editable install), else the working
    directory when it holds ``conf/train.yaml`` and ``train.py``."""
    source_tree = Path(__file__).resolve().parents[2]
    for candidate in (source_tree, (cwd or Path.cwd()).resolve()):
        if (candidate / MARKER).is_file() and (candidate / "train.py").is_file():
            return candidate
    raise ProjectNotFound(
        "laptrain's conf/ and train.py were not found: this command runs in a laptrain clone; "
        'cd to it, or install the clone editable (pip install -e ".[dev]")'
    )


def default_cache_dir() -> Path:
    """laptrain's machine-wide cache: ``$LAPTRAIN_CACHE`` or ``~/.cache/laptrain``."""
    return Path(os.environ.get("LAPTRAIN_CACHE") or Path.home() / ".cache" / "laptrain")


def conf_dir() -> Path:
    """The clone's ``conf/`` folder."""
    return project_root() / "conf"


def train_script() -> Path:
    """The clone's ``train.py``."""
    return project_root() / "train.py"
