"""conf/ and train.py are found in the clone, whether laptrain is installed editable or not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from laptrain.project import ProjectNotFound, conf_dir, project_root, train_script
from tests.conftest import ROOT


def test_the_editable_install_finds_its_clone_from_anywhere(tmp_path):
    assert project_root(cwd=tmp_path) == ROOT
    assert conf_dir() == ROOT / "conf" and train_script() == ROOT / "train.py"


def copy_as_plain_install(tmp_path):
    """The package copied out of the clone, as `pip install .` leaves it in site-packages."""
    site = tmp_path / "site-packages"
    shutil.copytree(ROOT / "src" / "laptrain", site / "laptrain")
    return site


def run_in(site, cwd, code):
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_a_plain_install_finds_the_clone_it_runs_in(tmp_path):
    site = copy_as_plain_install(tmp_path)
    done = run_in(site, ROOT, "import laptrain.project as p; print(p.__file__, p.conf_dir())")
    assert done.returncode == 0, done.stderr
    where, conf = done.stdout.split()
    assert where.startswith(str(site)) and conf == str(ROOT / "conf")


def test_a_plain_install_outside_the_clone_says_what_to_do_in_one_line(tmp_path):
    site = copy_as_plain_install(tmp_path)
    done = run_in(
        site, tmp_path, "from laptrain.commands.cli import main; raise SystemExit(main(['doctor']))"
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "error: laptrain's conf/ and train.py were not found: this command runs in a laptrain "
        'clone; cd to it, or install the clone editable (pip install -e ".[dev]")'
    ]
    assert issubclass(ProjectNotFound, ValueError)  # train.py's and the CLI's `error:` path
