"""The in-process runner the end-to-end tests use (tests/in_process.py) behaves as `python train.py`
does: the same exit code and error line, and nothing of the run left in the test process."""

from __future__ import annotations

import os
import signal

import torch

from tests.conftest import TINY, run_train, write_texts
from tests.in_process import train_here

BASE = ["hardware=cpu", "model=tiny_classifier", "data=text_csv", "run_name=t", *TINY]


def test_bad_input_gives_the_same_exit_code_and_line_as_a_process(tmp_path):
    args = [*BASE, "data.files.train=nope.csv"]
    here, there = train_here(args, tmp_path), run_train(args, tmp_path)
    assert here.returncode == there.returncode == 2
    assert here.stderr.strip() == there.stderr.strip() and here.stderr.startswith("error:")


def process_state() -> tuple:
    """What a run inside the test process might leave changed."""
    return (
        dict(os.environ),
        os.getcwd(),
        torch.get_num_threads(),
        signal.getsignal(signal.SIGTERM),
        signal.getsignal(signal.SIGINT),
    )


def test_a_run_leaves_nothing_behind_in_the_test_process(tmp_path):
    import sys

    argv, argv_list = list(sys.argv), sys.argv
    before = process_state()
    args = [*BASE, f"data.files.train={write_texts(tmp_path / 'texts.csv')}", "trainer.max_steps=2"]
    done = train_here([*args, "hardware.torch_threads=1", "test=false"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "done at global step 2" in done.stdout
    assert process_state() == before
    assert sys.argv is argv_list and sys.argv == argv  # train.py rebinds sys.argv
    # the run folder's lock went with the run: the same command runs again (and resumes)
    again = train_here([*args, "trainer.max_steps=3", "test=false"], tmp_path)
    assert again.returncode == 0 and "global step 2" in again.stdout, again.stderr[-2000:]


def test_each_run_chooses_its_folder_as_a_new_process_would(tmp_path):
    """``resume=false`` twice: two folders, as two processes make (the folder choice is cached
    per process)."""
    args = [*BASE, f"data.files.train={write_texts(tmp_path / 'texts.csv')}", "trainer.max_steps=1"]
    for _ in range(2):
        done = train_here([*args, "test=false", "resume=false", "logger=none"], tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "outputs").iterdir()) == ["t", "t-2"]


def test_pythonpath_in_env_reaches_the_imports_and_the_run_s_own_modules_go(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "mymod.py").write_text("VALUE = 1\n")
    args = ["hardware=cpu", "model._target_=mymod.Nothing", "run_name=x"]
    done = train_here(args, tmp_path, env={"PYTHONPATH": str(project)})
    assert done.returncode == 2 and "mymod" in done.stderr and "has no Nothing" in done.stderr, (
        done.stderr
    )
    import sys

    assert "mymod" not in sys.modules and str(project) not in sys.path


def test_a_forked_run_is_a_process_like_a_fresh_interpreter(tmp_path):
    """run_train forks from a server that imported torch (tests/forked_train.py): the same exit
    code, error line and sys.path as a fresh `python train.py`, and a variable read at import
    sends the run to a fresh interpreter."""
    import subprocess
    import sys

    from tests.forked_train import can_fork

    args = [*BASE, "data.files.train=nope.csv"]
    forked = run_train(args, tmp_path)
    fresh = run_train(args, tmp_path, fresh=True)
    assert forked.returncode == fresh.returncode == 2
    assert forked.stderr == fresh.stderr and forked.stderr.startswith("error:")
    assert not can_fork({**os.environ, "OMP_NUM_THREADS": "7"})
    assert can_fork({**os.environ, "PYTHONPATH": str(tmp_path)})
    show = "import sys; print(sys.path)"
    (tmp_path / "show.py").write_text(show)
    real = subprocess.run(
        [sys.executable, str(tmp_path / "show.py")], capture_output=True, text=True
    )
    from tests import forked_train

    path = forked_train._interpreter_path(os.environ.get("PYTHONPATH"))
    assert [str(tmp_path), *path] == eval(real.stdout)
