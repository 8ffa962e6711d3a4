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
from collections.abc import Mapping
from pathlib import Path

from omegaconf import OmegaConf

from tests.conftest import ROOT

LAPTRAIN = Path(sys.executable).parent / "laptrain"  # the installed console script
USER_GROUPS = ("model", "data")  # where `laptrain new` writes a user's presets


def copy_clone(folder: Path) -> Path:
    """The parts of a fresh clone that ``train.py`` and ``laptrain new`` read, copied into
    ``folder``: laptrain's own presets, none of this clone's user presets or ``conf/local``."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ROOT / "train.py", folder / "train.py")
    shutil.copy2(ROOT / "pyproject.toml", folder / "pyproject.toml")
    shutil.copytree(ROOT / "conf", folder / "conf", ignore=_not_laptrain_s)
    return folder


def _not_laptrain_s(folder: str, names: list[str]) -> set[str]:
    here = Path(folder)
    return {
        name
        for name in names
        if (name == "local" and here.name == "conf")
        or (name.endswith(".yaml") and not laptrain_preset(here / name))
    }


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


def laptrain_preset(path: Path) -> bool:
    """Whether a config file is laptrain's own: a user's presets are the ``conf/model/`` and
    ``conf/data/`` files whose ``_target_`` is outside laptrain (``user.…``, docs/your_model.md)."""
    if path.parent.name not in USER_GROUPS:
        return True
    node = OmegaConf.load(path)
    return (
        not isinstance(node, Mapping)
        or "_target_" not in node
        or str(node._target_).startswith("laptrain.")
    )


def laptrain_options(conf: Path, group: str) -> list[str]:
    """The options of ``conf/<group>/`` that are laptrain's own: the ones the suite checks. A
    user's presets (``_target_: user.…``) are theirs, tested by their own tests."""
    return sorted(path.stem for path in (conf / group).glob("*.yaml") if laptrain_preset(path))
