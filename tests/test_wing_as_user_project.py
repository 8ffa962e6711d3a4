"""The built-in families use nothing a user's project cannot: the classifier's wing, copied out of
the package into a project's ``user/`` folder, trains through ``train.py`` with presets of its own,
and its ``FAMILY`` hooks are asked as laptrain's own are. And the family ``laptrain new`` scaffolds
is heard by the launch."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.conftest import CONF, ROOT
from tests.in_process import train_here
from tests.new_project import copy_clone, new_project

WING = ROOT / "src" / "laptrain" / "families" / "classifier"
LATIN1 = ROOT / "tests" / "data" / "bad" / "latin1.csv"


def _train(clone: Path, *args: str) -> subprocess.CompletedProcess:
    """``python <clone>/train.py <args>`` from the clone, run in this process."""
    return train_here(list(args), clone, script=clone / "train.py")


def _wing_project(folder: Path) -> Path:
    """A clone copy whose ``user/textcls/`` is the classifier's wing, with two presets naming it."""
    clone = copy_clone(folder)
    shutil.copytree(WING, clone / "user" / "textcls", ignore=shutil.ignore_patterns("__pycache__"))
    old = "laptrain.families.classifier."
    presets = {
        ("model", "tiny_classifier"): "textcls",
        ("data", "stdlib_docstrings"): "textcls",
        ("data", "text_csv"): "textcls_csv",
    }
    for (group, preset), name in presets.items():
        text = (CONF / group / f"{preset}.yaml").read_text()
        assert old in text
        (clone / "conf" / group / f"{name}.yaml").write_text(text.replace(old, "user.textcls."))
    return clone


def test_the_classifier_wing_copied_out_trains_as_a_user_project(tmp_path):
    clone = _wing_project(tmp_path / "clone")
    args = ["model=textcls", "hardware=cpu", "debug=fast", "run_name=wing"]

    bad = _train(clone, *args, "data=textcls_csv", f"data.files.train={LATIN1}")
    assert bad.returncode == 2, bad.stderr[-2000:]  # the copy's file_rules hook read the file
    assert "data.encoding=latin-1" in bad.stderr and not (clone / "outputs" / "wing").exists()

    done = _train(clone, *args, "data=textcls")
    assert done.returncode == 0, done.stderr[-3000:]
    run = clone / "outputs" / "wing"
    saved = (run / ".hydra" / "config.yaml").read_text()
    assert "_target_: user.textcls.text_classifier.TextClassifierModule" in saved
    assert "laptrain.families" not in saved
    metrics = json.loads((run / "metrics.json").read_text())
    assert "test/acc" in metrics
    assert (run / "model" / "config.json").is_file() and (run / "labels.json").is_file()


def test_the_family_laptrain_new_scaffolds_is_asked_by_the_launch(tmp_path):
    clone = new_project(tmp_path / "clone")
    assert "FAMILY = Family(" in (clone / "user" / "my_task" / "__init__.py").read_text()
    done = _train(
        clone, "model=my_task", "data=my_task", "hardware=cpu", "hardware.precision=bf16-true"
    )
    assert done.returncode == 2
    [line] = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert "MyTaskModule keeps float32 weights" in line and "hardware.precision=32-true" in line
