"""``laptrain new NAME``, through the installed console script in a copy of the clone: the files it
writes, its refusals (one line, exit 2, nothing written or overwritten), and the generated project
training and passing its own test."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from laptrain.commands import new
from tests.new_project import copy_clone, laptrain, new_project

WRITTEN = [
    "user/__init__.py",
    "user/my_task/__init__.py",
    "user/my_task/model.py",
    "user/my_task/data.py",
    "user/my_task/test_my_task.py",
    "conf/model/my_task.yaml",
    "conf/data/my_task.yaml",
]


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_new_writes_a_package_and_two_presets_that_name_it(tmp_path):
    clone = copy_clone(tmp_path / "clone")
    before = files_under(clone)
    done = laptrain("new", "my_task", "--root", str(clone))
    assert done.returncode == 0, done.stderr
    assert files_under(clone) - before == {*WRITTEN, "user", "user/my_task"}
    assert [line.removeprefix("wrote ") for line in done.stdout.splitlines()[:-1]] == WRITTEN
    assert "python train.py model=my_task data=my_task" in done.stdout.splitlines()[-1]
    model = (clone / "conf/model/my_task.yaml").read_text()
    data = (clone / "conf/data/my_task.yaml").read_text()
    assert "_target_: user.my_task.model.MyTaskModule" in model
    assert "_target_: user.my_task.data.MyTaskDataModule" in data
    code = (clone / "user/my_task/data.py").read_text()
    assert "self.save_hyperparameters()" in code and "batch_size=self.hparams.batch_size" in code
    assert "{{" not in "".join((clone / f).read_text() for f in WRITTEN)


def test_the_generated_code_is_ruff_clean_under_the_project_s_rules(tmp_path):
    clone = new_project(tmp_path / "clone")
    long_name = laptrain(
        "new", "a_long_task_name_that_makes_long_lines", "--rewards", "--root", str(clone)
    )
    assert long_name.returncode == 0, long_name.stderr
    ruff = str(Path(sys.executable).parent / "ruff")
    for args in (["check", "--no-cache", "user"], ["format", "--no-cache", "--check", "user"]):
        done = subprocess.run([ruff, *args], cwd=clone, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    assert (clone / "user/a_long_task_name_that_makes_long_lines/rewards.py").is_file()
    assert not (clone / "user/my_task/rewards.py").exists()  # only with --rewards


def test_a_second_package_keeps_the_first_and_the_user_package(tmp_path):
    clone = new_project(tmp_path / "clone")
    init = (clone / "user/__init__.py").read_text()
    done = laptrain("new", "other", "--root", str(clone))
    assert done.returncode == 0, done.stderr
    assert not done.stdout.startswith("wrote user/__init__.py")
    assert (clone / "user/__init__.py").read_text() == init
    assert "class OtherModule(" in (clone / "user/other/model.py").read_text()


@pytest.mark.parametrize("name", ["9lives", "MyTask", "class", "my-task", "_x", "a/b", ""])
def test_a_bad_name_is_one_line_exit_2_and_nothing_written(tmp_path, name):
    clone = copy_clone(tmp_path / "clone")
    before = files_under(clone)
    done = laptrain("new", name, "--root", str(clone))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "lowercase Python identifier" in done.stderr
    assert files_under(clone) == before


def test_an_existing_file_is_named_and_nothing_is_written_or_overwritten(tmp_path):
    clone = copy_clone(tmp_path / "clone")
    mine = clone / "conf/data/my_task.yaml"
    mine.write_text("_target_: somewhere.Else\n")
    before = files_under(clone)
    done = laptrain("new", "my_task", "--root", str(clone))
    assert done.returncode == 2
    assert done.stderr == (
        f"error: conf/data/my_task.yaml exists in {clone}: laptrain new writes no file over "
        "another; choose another NAME or remove it\n"
    )
    assert files_under(clone) == before and mine.read_text() == "_target_: somewhere.Else\n"


def test_the_same_name_twice_is_refused_and_the_first_is_kept(tmp_path):
    clone = new_project(tmp_path / "clone")
    code = (clone / "user/my_task/model.py").read_text()
    done = laptrain("new", "my_task", "--root", str(clone))
    assert done.returncode == 2 and "user/my_task exists" in done.stderr
    assert (clone / "user/my_task/model.py").read_text() == code


def test_outside_a_clone_is_one_line_exit_2(tmp_path):
    done = laptrain("new", "my_task", "--root", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "give --root <clone>" in done.stderr
    assert not any(tmp_path.iterdir())


def test_a_write_that_fails_part_way_takes_back_what_it_wrote(tmp_path, monkeypatch):
    clone = copy_clone(tmp_path / "clone")
    before = files_under(clone)
    real_write = Path.write_text

    def full_disk(self, *args, **kwargs):
        if self.name == "my_task.yaml" and self.parent.name == "data":
            raise OSError(28, "No space left on device")
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OSError, match="No space left"):
        new.write_new("my_task", clone)
    assert files_under(clone) == before


@pytest.mark.slow
def test_the_generated_test_passes(tmp_path):
    """Its two tests: a plain Lightning fit, and `python train.py model=my_task data=my_task
    debug=fast` (about 30 s on 2 cores)."""
    clone = new_project(tmp_path / "clone")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "user/my_task"],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout


def test_the_generated_tests_fit_passes(tmp_path, monkeypatch):
    """The fast twin of the slow test above: the generated file imports from the clone and its
    plain Lightning fit passes in seconds (its train.py run is what test_user_project.py runs)."""
    clone = new_project(tmp_path / "clone")
    monkeypatch.syspath_prepend(str(clone))
    for name in [m for m in sys.modules if m == "user" or m.startswith("user.")]:
        monkeypatch.delitem(sys.modules, name)
    generated = importlib.import_module("user.my_task.test_my_task")
    assert generated.__file__.startswith(str(clone))
    generated.test_the_module_learns_the_data()
    for name in [m for m in sys.modules if m == "user" or m.startswith("user.")]:
        del sys.modules[name]
