"""The sweeper's config node, registered as ``hydra/sweeper=laptrain_optuna``.

Kept apart from the sweeper so that Hydra's plugin scan, which imports every module here on every
run, imports neither optuna nor torch. No ``from __future__ import annotations``: the scan runs a
module before it is in sys.modules, where dataclasses cannot resolve string annotations.
"""

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore


@dataclass
class LaptrainOptunaSweeperConf:
    _target_: str = "hydra_plugins.laptrain_optuna_sweeper.optuna_sweeper.LaptrainOptunaSweeper"
    # "maximize"/"minimize" (or "max"/"min", as a model YAML's _metric_.mode spells them)
    direction: str = "maximize"
    study_name: str | None = None
    # An RDB URL (sqlite:///path/optuna.db) makes the study resumable; None keeps it in memory.
    storage: str | None = None
    # Finished (COMPLETE or PRUNED) trials the study should hold when the sweep ends.
    n_trials: int = 20
    # Trials handed to the launcher at once; > 1 only pays with a parallel launcher.
    n_jobs: int = 1
    # Fraction of a batch's trials that may fail (error, or no metric) before the sweep stops.
    max_failure_rate: float = 0.0
    # An optuna sampler; with `_partial_: true` and a seed, a resumed sweep reseeds it.
    sampler: Any = None
    # An Optuna pruner by name (median, percentile, successive_halving, hyperband, threshold,
    # wilcoxon...) or a _target_ with its arguments; None = no pruning. Needs storage: each job
    # reports its metric after every validation to its trial there and stops when pruned.
    pruner: Any = None
    # key: search space, in hydra-optuna-sweeper's syntax (choice, range, interval, tag(log, ...)).
    params: Any = None


ConfigStore.instance().store(
    group="hydra/sweeper",
    name="laptrain_optuna",
    node=LaptrainOptunaSweeperConf,
    provider="laptrain",
)
