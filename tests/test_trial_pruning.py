"""Pruning in Optuna sweeps (laptrain.callbacks.trial_pruning and laptrain's sweeper): each job
reports its monitored metric to its trial after every validation, stops when pruned with one line,
keeps its checkpoints, and the study records a PRUNED trial that a rerun of the sweep does not run
again."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna", reason="the [sweep] extra: pip install -e '.[sweep]'")

from laptrain.callbacks.trial_pruning import pruner_named  # noqa: E402
from tests.conftest import CONF_FIXTURES, ROOT, run_train, write_texts  # noqa: E402
from tests.in_process import train_here  # noqa: E402


def test_optuna_pruners_by_name():
    assert isinstance(pruner_named("median"), optuna.pruners.MedianPruner)
    assert isinstance(pruner_named("successive_halving"), optuna.pruners.SuccessiveHalvingPruner)
    assert isinstance(pruner_named("hyperband"), optuna.pruners.HyperbandPruner)
    with pytest.raises(ValueError, match=r"^hydra.sweeper.pruner=medain: no such Optuna pruner"):
        pruner_named("medain")


def pruned_sweep(tmp_path: Path) -> list[str]:
    """A sweep of 2 trials of 3 validations each whose pruner, a threshold no accuracy reaches
    (1.1), prunes every trial at its first validation."""
    return [
        "-m",
        "hardware=cpu",
        "hparams_search=optuna",
        "experiment=tiny_sweep",
        f"hydra.searchpath=[file://{CONF_FIXTURES}]",
        f"data.files.train={write_texts(tmp_path / 'texts.csv')}",
        "trainer.max_steps=6",  # validations after steps 2, 4 and 6
        "hydra.sweeper.n_trials=2",
        "+hydra.sweeper.pruner._target_=optuna.pruners.ThresholdPruner",
        "+hydra.sweeper.pruner.lower=1.1",
    ]


def test_a_sweep_prunes_its_trials_finishes_and_resumes_without_running_them_again(tmp_path):
    args = pruned_sweep(tmp_path)
    first = train_here(args, tmp_path)
    log = first.stdout + first.stderr
    assert first.returncode == 0, first.stderr[-3000:]
    assert log.count("pruned at validation 1 (val/acc ") == 2, log[-3000:]
    sweep = tmp_path / "outputs" / "multirun" / "t"
    storage = f"sqlite:///{sweep / 'optuna.db'}"
    trials = optuna.load_study(study_name="t", storage=storage).trials
    assert [t.state.name for t in trials] == ["PRUNED", "PRUNED"]
    assert [list(t.intermediate_values) for t in trials] == [[1], [1]]  # the validation's index
    jobs = sorted(p for p in sweep.iterdir() if (p / "checkpoints" / "last.ckpt").is_file())
    assert len(jobs) == 2  # stopped at step 2, checkpoints kept
    for job in jobs:
        status = json.loads((job / "report.json").read_text())["run"]["status"]
        assert status.startswith("finished: pruned at validation 1 (val/acc ")

    again = train_here(args, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 finished trials, 0 to run" in again.stdout + again.stderr
    assert len(optuna.load_study(study_name="t", storage=storage).trials) == 2


@pytest.mark.slow  # ~20 s: two submitit jobs, each a process of its own (fast twin above)
def test_submitit_jobs_find_their_trial_through_the_storage_and_are_pruned(tmp_path):
    """hydra/launcher=submitit_local runs each job in its own process: the trial comes from the
    study's storage, not the sweeper's memory."""
    launcher = ["hydra/launcher=submitit_local", "hydra.sweeper.n_jobs=2"]
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = run_train([*pruned_sweep(tmp_path), *launcher], tmp_path, env=env, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    storage = f"sqlite:///{tmp_path / 'outputs' / 'multirun' / 't' / 'optuna.db'}"
    trials = optuna.load_study(study_name="t", storage=storage).trials
    assert [t.state.name for t in trials] == ["PRUNED", "PRUNED"]
    logs = (tmp_path / "outputs" / "multirun" / "t" / ".submitit").glob("*/*_log.out")
    assert sum("pruned at validation 1 (val/acc " in p.read_text() for p in logs) == 2
