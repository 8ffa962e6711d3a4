"""A user's own module and data (``laptrain new my_task`` in a copy of the clone, nothing under
src/laptrain): ``python train.py`` imports ``user.my_task`` from the clone and trains it, and
``laptrain why``, ``laptrain runs compare`` and ``laptrain bench`` work on it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from laptrain import project
from laptrain.commands import cli
from laptrain.commands.why import read_run, run_findings
from tests.in_process import train_here
from tests.new_project import laptrain, new_project

FAST = ["model=my_task", "data=my_task", "hardware=cpu", "trainer.max_epochs=2"]


def train(clone: Path, *args: str) -> subprocess.CompletedProcess:
    """``python <clone>/train.py <args>`` from the clone's root, as the user runs it (in this
    process: tests/in_process.py)."""
    return train_here(list(args), clone, script=clone / "train.py")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    clone = new_project(tmp_path_factory.mktemp("user") / "clone")
    return clone, train(clone, *FAST)


def test_train_py_trains_a_new_project_at_once(trained):
    clone, done = trained
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "model: MyTaskModule" in done.stdout
    # data.batch_size=from_profile: hardware=cpu's 16, found in the datamodule's hparams
    assert (
        "micro batch size: 16 (hardware.batch_size, set on MyTaskDataModule.hparams" in done.stdout
    )
    assert "done at global step 104" in done.stdout  # 819 rows / 16 = 52 batches, 2 epochs
    test_line = next(line for line in done.stdout.splitlines() if line.startswith("test: acc"))
    assert float(test_line.split()[2]) > 0.5  # 4 classes: chance is 0.25
    run = clone / "outputs" / "my_task-my_task"
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert list((run / "checkpoints").glob("best-step*.ckpt"))


def test_laptrain_why_reads_a_user_module_run(trained):
    clone, done = trained
    assert done.returncode == 0
    why = laptrain("why", "outputs/my_task-my_task", cwd=clone)
    assert why.returncode == 0, why.stderr
    assert why.stdout.splitlines()[0] == "outputs/my_task-my_task: finished at step 104"
    # The user's monitored metric is what `why` judges the run by. Its final value is printed
    # when no rule fires; on a loaded machine the throughput rule may fire instead (a true
    # finding: "look for other processes sharing the machine"), so read what `why` read.
    records = read_run(clone / "outputs" / "my_task-my_task")
    assert records.monitor == "val/acc" and records.series["val/acc"], records.monitor
    if [f.kind for f in run_findings(records)] == ["ok"]:
        assert "val/acc" in why.stdout


@pytest.mark.slow
def test_laptrain_runs_compare_puts_two_user_runs_side_by_side(trained):
    """A second run at another learning rate (about 15 s on 2 cores)."""
    clone, done = trained
    other = train(clone, *FAST, "model.lr=0.001", "run_name=slow_lr")
    assert other.returncode == 0, other.stderr[-2000:]
    compared = laptrain(
        "runs", "compare", "my_task-my_task", "slow_lr", "--root", "outputs", cwd=clone
    )
    assert compared.returncode == 0, compared.stderr
    assert "| model.lr" in compared.stdout and "0.001" in compared.stdout
    assert "best val/acc" in compared.stdout
    assert (clone / "runs_compare.png").is_file()


@pytest.fixture
def clone_as_project(tmp_path, monkeypatch) -> Path:
    """A new project that the ``laptrain`` command finds as its clone; its ``user`` package is
    dropped from this process afterwards."""
    clone = new_project(tmp_path / "clone")
    for where in (project, cli):
        monkeypatch.setattr(where, "project_root", lambda cwd=None: clone)
    monkeypatch.setattr(sys, "path", list(sys.path))
    _forget_user_packages()  # another test's user/ package, imported in this process
    yield clone
    _forget_user_packages()


def _forget_user_packages() -> None:
    for name in [m for m in sys.modules if m == "user" or m.startswith("user.")]:
        del sys.modules[name]


def test_laptrain_bench_imports_user_code_from_the_clone(clone_as_project, capsys):
    """The console script's sys.path holds its bin/ folder, not the clone; `laptrain` puts the
    clone's root first, as `python train.py` has it, so `user.my_task` imports."""
    assert str(clone_as_project) not in sys.path
    code = cli.main(["bench", "model=my_task", "data=my_task", "hardware=cpu", "--steps", "4"])
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    assert "laptrain bench (4 timed steps, cpu" in out.out
    assert sys.modules["user.my_task.model"].__file__.startswith(str(clone_as_project))


def test_a_family_in_the_project_s_user_folder_brings_its_own_command(clone_as_project, capsys):
    """``FAMILY.commands`` in ``user/<task>/__init__.py``: ``laptrain`` lists and runs the
    command as it does laptrain's own families' (``predict``, ``export``)."""
    greet = clone_as_project / "user" / "greet"
    greet.mkdir()
    (greet / "__init__.py").write_text(
        "from laptrain.family import Family\n\n\n"
        "def _commands():\n"
        "    from . import commands\n\n"
        "    return commands\n\n\n"
        "FAMILY = Family(name='greet', summary='says hello', commands=_commands)\n"
    )
    (greet / "commands.py").write_text(
        "def hello(args):\n"
        "    print(f'hello {args.who}')\n"
        "    return 0\n\n\n"
        "def add_commands(commands):\n"
        "    parser = commands.add_parser('hello', help='say hello to someone')\n"
        "    parser.add_argument('who')\n\n\n"
        "COMMANDS = {'hello': hello}\n"
    )
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "say hello to someone" in capsys.readouterr().out
    assert cli.main(["hello", "world"]) == 0
    assert capsys.readouterr().out == "hello world\n"
