"""Where laptrain's repository is: ``conf/`` and ``train.py`` live there, not in the package.

laptrain is a template: users edit ``conf/`` in their clone, so the configs stay files of the
repository rather than package data. An editable install (the README's ``pip install -e``) keeps
``src/laptrain`` inside the clone; a plain ``pip install .`` copies the package elsewhere, and then
the clone is found from the working directory. Neither found: one line saying what to do.
No torch import here (the launcher reads profiles before torch is imported).
"""

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
    """laptrain's machine-wide cache (model sources, measured worker costs): ``$LAPTRAIN_CACHE``
    or ``~/.cache/laptrain``."""
    return Path(os.environ.get("LAPTRAIN_CACHE") or Path.home() / ".cache" / "laptrain")


def conf_dir() -> Path:
    """The clone's ``conf/`` folder."""
    return project_root() / "conf"


def train_script() -> Path:
    """The clone's ``train.py``."""
    return project_root() / "train.py"
