"""Report the monitored metric to this job's Optuna trial after every validation, and stop the run
when the study's pruner says the trial is hopeless (docs/sweeps.md).

Hydra's sweepers never hand a job its trial (hydra#1710): the sweeper puts its number in
:data:`TRIAL_ENV` and the job finds it in the study's RDB storage, also in another process.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

if TYPE_CHECKING:
    import optuna

TRIAL_ENV = "LAPTRAIN_OPTUNA_TRIAL"  # the trial's number in its study, set by the sweeper


def pruner_named(spec: Any) -> optuna.pruners.BasePruner | None:
    """``hydra.sweeper.pruner``: None, a pruner already built (a ``_target_``), or Optuna's pruner
    by name: ``median`` is ``MedianPruner``, ``successive_halving`` ``SuccessiveHalvingPruner``."""
    import optuna
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    if OmegaConf.is_dict(spec):  # a job reads its hydra.sweeper node uninstantiated
        spec = instantiate(spec)
    if spec is None or isinstance(spec, optuna.pruners.BasePruner):
        return spec
    name = "".join(part.title() for part in str(spec).split("_")) + "Pruner"
    found = getattr(optuna.pruners, name, None)
    if not isinstance(found, type) or not issubclass(found, optuna.pruners.BasePruner):
        names = sorted(
            n.removesuffix("Pruner").lower()
            for n in dir(optuna.pruners)
            if n.endswith("Pruner") and n != "BasePruner"
        )
        raise ValueError(
            f"hydra.sweeper.pruner={spec}: no such Optuna pruner; use one of {', '.join(names)} "
            "(successivehalving is successive_halving), or a _target_ with its arguments"
        )
    return found()


def trial_of(storage: str, study_name: str, number: int, pruner: Any) -> optuna.Trial:
    """Trial ``number`` of the study in ``storage``, with ``pruner`` deciding its prunes."""
    import optuna

    study = optuna.load_study(study_name=study_name, storage=storage, pruner=pruner_named(pruner))
    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    return optuna.Trial(study, trial_id)


def sweep_trial_number() -> int | None:
    """The trial this job runs for, when a laptrain sweep with a pruner started it."""
    number = os.environ.get(TRIAL_ENV)
    return int(number) if number else None


class TrialPruning(Callback):
    """``trial.report`` after every validation; stops the run once ``trial.should_prune()``
    (``ended_early`` is then the console line)."""

    def __init__(self, trial: optuna.Trial, monitor: str) -> None:
        self.trial, self.monitor = trial, monitor
        self.validations = 0
        self.ended_early: str | None = None
        self.value: float | None = None

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return  # the metric check names an unlogged metric (monitored_metric.py)
        self.validations += 1
        self.value = float(trainer.callback_metrics[self.monitor])
        prune = False
        if trainer.is_global_zero:  # one report per validation; rank 0 decides for every rank
            self.trial.report(self.value, step=self.validations)
            prune = self.trial.should_prune()
        if trainer.strategy.reduce_boolean_decision(prune, all=False):
            self.ended_early = (
                f"pruned at validation {self.validations} ({self.monitor} {self.value:.4g})"
            )
            trainer.should_stop = True

    def state_dict(self) -> dict[str, Any]:
        return {"validations": self.validations}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.validations = state_dict["validations"]


def raise_in_sweep() -> None:
    """A pruned job in a sweep raises ``optuna.TrialPruned``, which Hydra's ``run_job`` hands to
    the sweeper as the job's return, where a ``sys.exit`` would end the whole sweep; a job outside
    one returns (and exits with its own code)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        import optuna

        raise optuna.TrialPruned()
