"""A Hydra sweeper on current Optuna (ask/tell, RDB storage) whose study survives a rerun.

Gap it fills: hydra-optuna-sweeper 1.3.0, the newest release that installs with hydra-core 1.3,
pins optuna < 3 (whose sqlite storage fails under SQLAlchemy 2), and its Optuna 4 line (1.4.0rc)
needs the pre-release hydra-core 1.4. Both lines, rerun on the same storage, run ``n_trials`` more
trials, number jobs from 0 again and, with a seeded sampler, propose the same first points again.
This sweeper reads the same ``params:`` syntax (``choice()``, ``range()``, ``interval()``,
``tag(log, interval())``) so configs carry over, and on a rerun:

- counts the study's COMPLETE and PRUNED trials against ``n_trials`` (a finished trial never runs
  again; a finished sweep starts none);
- marks trials a killed sweep left RUNNING as FAIL and queues their parameters again, so the next
  trial lands in the same job folder and resumes from its ``last.ckpt``;
- numbers each job after its trial (job N is trial N), so job numbers continue;
- reseeds a seeded ``_partial_`` sampler with the seed plus the number of trials already stored.

A job's return value is the trial's value; an error, None or NaN counts as a failed trial, and more
than ``max_failure_rate`` of a batch failing stops the sweep. With ``pruner`` set, each job gets its
trial's number in its environment (``hydra.job.env_set``; Hydra's own sweepers never give a job
its trial, hydra#1710), reports to that trial in the study's storage after every validation
(laptrain/callbacks/trial_pruning.py) and, once pruned, raises ``optuna.TrialPruned``: the trial
is PRUNED. Replace this with the official plugin once its Optuna 4 line works with a final Hydra
release.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    ChoiceSweep,
    IntervalSweep,
    Override,
    RangeSweep,
    Transformer,
)
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

log = logging.getLogger(__name__)

DIRECTIONS = {"max": "maximize", "min": "minimize", "maximize": "maximize", "minimize": "minimize"}
SQLITE = "sqlite:///"


class SweepFailed(RuntimeError):
    """More trials failed than ``hydra.sweeper.max_failure_rate`` allows."""


def distribution(override: Override) -> BaseDistribution | None:
    """The Optuna distribution a sweep override describes, or None for a fixed value."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    if not override.is_sweep_override():
        return None
    value = override.value()
    if isinstance(value, ChoiceSweep) or (isinstance(value, RangeSweep) and value.shuffle):
        return CategoricalDistribution(list(override.sweep_iterator(Transformer.encode)))
    if isinstance(value, RangeSweep):  # range(start, stop, step): stop excluded, as in Python
        start, stop, step = value.start, value.stop, value.step
        if any(isinstance(v, float) for v in (start, stop, step)):
            n = math.ceil((stop - start) / step - 1e-9)
            return FloatDistribution(start, start + (n - 1) * step, step=step)
        start, stop, step = int(start), int(stop), int(step)
        return IntDistribution(start, start + (stop - start - 1) // step * step, step=step)
    if isinstance(value, IntervalSweep):  # interval() is float; int(interval()) is int
        log_scale = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log_scale)
        return FloatDistribution(float(value.start), float(value.end), log=log_scale)
    raise ValueError(f"{override.input_line}: this sweep type cannot be searched by Optuna")


def search_space(overrides: Sequence[str]) -> tuple[dict[str, BaseDistribution], dict[str, str]]:
    """``key=value`` strings split into Optuna distributions and fixed values; a later override of
    a key wins, so a command-line ``key=value`` pins a key the config searches."""
    space: dict[str, BaseDistribution] = {}
    fixed: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.get_key_element()
        space.pop(key, None)
        fixed.pop(key, None)
        found = distribution(override)
        if found is None:
            fixed[key] = override.get_value_element_as_str()
        else:
            space[key] = found
    return space, fixed


def reopen(study: optuna.Study) -> int:
    """Mark trials left RUNNING by a stopped sweep as FAIL and queue their parameters again;
    returns how many trials are finished (COMPLETE or PRUNED)."""
    from optuna.trial import TrialState

    finished = 0
    for trial in study.get_trials(deepcopy=False):
        if trial.state == TrialState.RUNNING:
            study.tell(trial.number, state=TrialState.FAIL)
            study.enqueue_trial(trial.params)
            log.info(f"trial {trial.number} was left running: marked failed, its parameters queued")
        elif trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
            finished += 1
    return finished


def trial_value(ret: JobReturn) -> float:
    """The job's return value as a float; raises for an error, None or NaN."""
    value = ret.return_value  # re-raises the job's exception
    if value is None:
        raise ValueError("the job returned no metric (None)")
    value = float(value)
    if math.isnan(value):
        raise ValueError("the job returned NaN")
    return value


class LaptrainOptunaSweeper(Sweeper):
    """``hydra/sweeper=laptrain_optuna``; the module docstring says how it differs upstream."""

    def __init__(
        self,
        direction: str = "maximize",
        study_name: str | None = None,
        storage: str | None = None,
        n_trials: int = 20,
        n_jobs: int = 1,
        max_failure_rate: float = 0.0,
        sampler: Any = None,
        params: Mapping[str, Any] | None = None,
        pruner: Any = None,
    ) -> None:
        if str(direction) not in DIRECTIONS:
            raise ValueError(
                f"hydra.sweeper.direction={direction}: use one of {', '.join(DIRECTIONS)}"
            )
        if not 0.0 <= float(max_failure_rate) <= 1.0:
            raise ValueError(f"hydra.sweeper.max_failure_rate={max_failure_rate}: use 0 to 1")
        if int(n_jobs) < 1 or int(n_trials) < 0:
            raise ValueError("hydra.sweeper.n_jobs must be >= 1 and n_trials >= 0")
        if pruner is not None and not storage:
            raise ValueError(
                f"hydra.sweeper.pruner={pruner} needs hydra.sweeper.storage (e.g. sqlite:///"
                "optuna.db): each job finds its trial there"
            )
        self.direction = DIRECTIONS[str(direction)]
        self.pruner = pruner
        self.study_name = study_name
        self.storage = storage
        self.n_trials = int(n_trials)
        self.n_jobs = int(n_jobs)
        self.max_failure_rate = float(max_failure_rate)
        self.sampler = sampler
        self.params = dict(params or {})
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Any = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def _sampler(self, stored_trials: int) -> optuna.samplers.BaseSampler | None:
        """The sampler; a seeded partial gets ``seed + stored_trials``, so that a resumed sweep
        does not draw the points its first run drew."""
        if not isinstance(self.sampler, functools.partial):
            return self.sampler
        seed = self.sampler.keywords.get("seed")
        if seed is None:
            return self.sampler()
        return self.sampler(seed=int(seed) + stored_trials)

    def open_study(self) -> optuna.Study:
        import optuna

        if self.storage and str(self.storage).startswith(SQLITE):
            Path(str(self.storage)[len(SQLITE) :]).parent.mkdir(parents=True, exist_ok=True)
        from laptrain.callbacks.trial_pruning import pruner_named

        study = optuna.create_study(
            study_name=self.study_name,
            storage=self.storage,
            direction=self.direction,
            pruner=pruner_named(self.pruner),
            load_if_exists=True,
        )
        return study

    def sweep(self, arguments: list[str]) -> list[Sequence[JobReturn]]:
        assert self.config is not None and self.launcher is not None
        from laptrain.callbacks.trial_pruning import TRIAL_ENV  # not at import: Hydra's scan

        space, fixed = search_space([f"{k}={v}" for k, v in self.params.items()] + list(arguments))
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")

        if self.n_jobs > 1 and type(self.launcher).__name__ == "BasicLauncher":
            log.warning(
                f"hydra.sweeper.n_jobs={self.n_jobs} with Hydra's basic launcher runs the trials "
                "one after another, each batch chosen before the previous one's results: keep "
                "n_jobs=1 on one machine, or use a parallel launcher (launcher=slurm)"
            )
        study = self.open_study()
        finished = reopen(study)
        study.sampler = self._sampler(len(study.get_trials(deepcopy=False))) or study.sampler
        to_go = max(self.n_trials - finished, 0)
        log.info(
            f"study {study.study_name} ({self.storage or 'in memory'}): {finished} finished "
            f"trials, {to_go} to run, {self.direction} {', '.join(space) or 'nothing'}"
        )
        returns: list[Sequence[JobReturn]] = []
        while to_go > 0:
            trials = [study.ask(space) for _ in range(min(self.n_jobs, to_go))]
            batch = [
                [
                    *(f"{k}={v}" for k, v in fixed.items()),
                    *(f"{k}={v}" for k, v in t.params.items()),
                    *([f"++hydra.job.env_set.{TRIAL_ENV}={t.number}"] if self.pruner else []),
                ]
                for t in trials
            ]
            self.validate_batch_is_legal(batch)
            results = self.launcher.launch(batch, initial_job_idx=trials[0].number)
            failures = tell_results(study, trials, results)
            returns.append(results)
            to_go -= len(trials)
            if failures and len(failures) / len(trials) > self.max_failure_rate:
                raise SweepFailed(
                    f"{'; '.join(failures)} (hydra.sweeper.max_failure_rate="
                    f"{self.max_failure_rate}); rerun the same command to resume the study"
                )
        save_best(study, sweep_dir)
        return returns


def tell_results(
    study: optuna.Study, trials: Sequence[optuna.Trial], results: Sequence[JobReturn]
) -> list[str]:
    """Tell the study each job's value, or a failure; returns one line per failed trial."""
    from optuna import TrialPruned
    from optuna.trial import TrialState

    failures = []
    for trial, ret in zip(trials, results):
        try:
            value = trial_value(ret)
        except TrialPruned:  # the job's pruning callback stopped it (raise_in_sweep)
            study.tell(trial, state=TrialState.PRUNED)
            log.info(f"trial {trial.number} pruned")
            continue
        except Exception as err:
            study.tell(trial, state=TrialState.FAIL)
            failures.append(f"trial {trial.number}: {err}")
            log.warning(f"trial {trial.number} failed: {err}")
            continue
        study.tell(trial, value)
    return failures


def save_best(study: optuna.Study, sweep_dir: Path) -> None:
    """Log the best trial and write it to ``optimization_results.yaml``, once a trial completed."""
    if any(t.state.name == "COMPLETE" for t in study.get_trials(deepcopy=False)):
        best = study.best_trial
        log.info(f"best: trial {best.number}, value {best.value}, {best.params}")
        OmegaConf.save(
            OmegaConf.create({"number": best.number, "value": best.value, "params": best.params}),
            sweep_dir / "optimization_results.yaml",
        )
