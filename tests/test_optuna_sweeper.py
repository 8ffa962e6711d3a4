"""laptrain's Optuna sweeper: the search-space syntax, and a study that resumes instead of repeating
(against a recording launcher here; through train.py in test_hparams_search.py)."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import optuna  # the [sweep] extra, which [dev] installs: a missing optuna fails here, not skips
import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf
from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState

import hydra_plugins.laptrain_optuna_sweeper.optuna_sweeper as plugin
from hydra_plugins.laptrain_optuna_sweeper.optuna_sweeper import (
    LaptrainOptunaSweeper,
    search_space,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)
SPACE = {"lr": "tag(log, interval(1e-4, 1e-2))", "wd": "interval(0.0, 0.1)", "bs": "choice(8, 16)"}


def test_search_space_reads_hydra_optuna_sweeper_syntax():
    space, fixed = search_space(
        [
            "lr=tag(log, interval(1e-4, 1e-2))",
            "wd=interval(0.0, 0.1)",
            "layers=int(interval(1, 4))",
            "bs=choice(8, 16, 32)",
            "heads=range(2, 8, 2)",
            "opt=choice(adam, sgd)",
            "model=tiny_classifier",
            "wd=0.01",  # a later fixed value pins a searched key
        ]
    )
    assert space == {
        "lr": FloatDistribution(1e-4, 1e-2, log=True),
        "layers": IntDistribution(1, 4),
        "bs": CategoricalDistribution([8, 16, 32]),
        "heads": IntDistribution(2, 6, step=2),  # range() excludes its stop, as in Hydra
        "opt": CategoricalDistribution(["adam", "sgd"]),
    }
    assert fixed == {"model": "tiny_classifier", "wd": "0.01"}


class RecordingLauncher:
    """Runs each job as a function of its overrides and records what it was asked to launch."""

    def __init__(self, objective):
        self.objective = objective
        self.launched: list[tuple[int, list[str]]] = []

    def launch(self, job_overrides, initial_job_idx):
        results = []
        for i, overrides in enumerate(job_overrides):
            self.launched.append((initial_job_idx + i, list(overrides)))
            values = dict(o.split("=", 1) for o in overrides)
            ret = JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
            ret.return_value = self.objective(values)
            results.append(ret)
        return results


class AnyConfigLoads:
    def load_sweep_config(self, master_config, sweep_overrides):
        return master_config


def sweeper(tmp_path: Path, launcher: RecordingLauncher, **kwargs) -> LaptrainOptunaSweeper:
    options = {
        "study_name": "t",
        "storage": f"sqlite:///{tmp_path}/sweep/optuna.db",
        "n_trials": 2,
        "sampler": functools.partial(optuna.samplers.TPESampler, seed=3, n_startup_trials=5),
        "params": SPACE,
        **kwargs,
    }
    made = LaptrainOptunaSweeper(**options)
    made.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}}})
    made.launcher = launcher
    made.config_loader = AnyConfigLoads()  # Sweeper.validate_batch_is_legal's loader
    return made


def study(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path}/sweep/optuna.db")


def lr_objective(values: dict[str, str]) -> float:
    return -abs(math.log10(float(values["lr"])) + 3)


def test_a_rerun_runs_only_the_missing_trials_and_continues_job_numbers(tmp_path):
    first = RecordingLauncher(lr_objective)
    sweeper(tmp_path, first).sweep(["model=tiny"])
    assert [job for job, _ in first.launched] == [0, 1]
    assert all("model=tiny" in overrides for _, overrides in first.launched)
    assert [t.state for t in study(tmp_path).trials] == [TrialState.COMPLETE] * 2

    again = RecordingLauncher(lr_objective)
    sweeper(tmp_path, again).sweep(["model=tiny"])
    assert again.launched == []  # the study already holds its 2 trials

    more = RecordingLauncher(lr_objective)
    sweeper(tmp_path, more, n_trials=4).sweep(["model=tiny"])
    assert [job for job, _ in more.launched] == [2, 3]
    trials = study(tmp_path).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    # the reseeded sampler does not draw the first run's points again
    assert {t.params["lr"] for t in trials[2:]}.isdisjoint(t.params["lr"] for t in trials[:2])
    assert (tmp_path / "sweep" / "optimization_results.yaml").is_file()


def test_a_trial_left_running_is_marked_failed_and_run_again_with_its_values(tmp_path):
    sweeper(tmp_path, RecordingLauncher(lr_objective), n_trials=1).sweep([])
    stopped = study(tmp_path)
    killed = stopped.ask(search_space([f"{k}={v}" for k, v in SPACE.items()])[0])
    assert stopped.trials[1].state == TrialState.RUNNING  # the sweep died during this trial

    resumed = RecordingLauncher(lr_objective)
    sweeper(tmp_path, resumed, n_trials=2).sweep([])
    trials = study(tmp_path).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert trials[2].params == killed.params  # same values: same job folder, resumed from its ckpt
    assert [job for job, _ in resumed.launched] == [2]


@pytest.mark.parametrize("returned", [None, float("nan")])
def test_a_trial_without_a_metric_fails_and_stops_the_sweep(tmp_path, returned):
    launcher = RecordingLauncher(lambda values: returned)
    # Hydra's plugin scan re-executes the plugin module in place (hydra/core/plugins.py,
    # _scan_all_plugins), so the exception class is looked up in the module when raised.
    with pytest.raises(plugin.SweepFailed, match="no metric|NaN"):
        sweeper(tmp_path, launcher, n_trials=3).sweep([])
    assert len(launcher.launched) == 1
    assert [t.state for t in study(tmp_path).trials] == [TrialState.FAIL]


def test_max_failure_rate_lets_a_sweep_go_on_past_failures(tmp_path):
    launcher = RecordingLauncher(lambda values: None if values["bs"] == "8" else 1.0)
    sweeper(tmp_path, launcher, n_trials=4, max_failure_rate=1.0).sweep([])
    assert len(launcher.launched) == 4


def test_bad_sweeper_options_name_the_key():
    with pytest.raises(ValueError, match="hydra.sweeper.direction"):
        LaptrainOptunaSweeper(direction="up")
    with pytest.raises(ValueError, match="hydra.sweeper.max_failure_rate"):
        LaptrainOptunaSweeper(max_failure_rate=2)
