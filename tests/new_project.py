"""A user's clone for tests: ``train.py``, ``conf/`` and ``pyproject.toml`` copied to a tmp folder,
and ``laptrain new NAME`` run there through the installed console script.

``python <clone>/train.py`` then reads the copy's ``conf/`` (train.py's own folder) and imports
``user.NAME`` from it (Python puts a script's folder on ``sys.path``), as in a real clone; the
``laptrain`` package is the editable install of this repository.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from laptrain.model.families import is_laptrain_target
from tests.conftest import ROOT

LAPTRAIN = Path(sys.executable).parent / "laptrain"  # the installed console script


def copy_clone(folder: Path) -> Path:
    """The parts of a clone that ``train.py`` and ``laptrain new`` read, copied into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ROOT / "train.py", folder / "train.py")
    shutil.copy2(ROOT / "pyproject.toml", folder / "pyproject.toml")
    shutil.copytree(ROOT / "conf", folder / "conf", ignore=shutil.ignore_patterns("local"))
    return folder


def laptrain(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The installed ``laptrain`` command with ``args``."""
    return subprocess.run(
        [str(LAPTRAIN), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def new_project(folder: Path, name: str = "my_task") -> Path:
    """A clone copy in ``folder`` with ``laptrain new <name>`` written into it."""
    clone = copy_clone(folder)
    done = laptrain("new", name, "--root", str(clone))
    assert done.returncode == 0, done.stderr
    return clone


def laptrain_options(conf: Path, group: str) -> list[str]:
    """The options of ``conf/<group>/`` that name laptrain's own code (or nothing): the ones the
    suite checks. A user's presets (``_target_: user.…``) are theirs, tested by their own tests."""
    return sorted(
        path.stem
        for path in (conf / group).glob("*.yaml")
        if "_target_" not in (node := OmegaConf.load(path)) or is_laptrain_target(node._target_)
    )
