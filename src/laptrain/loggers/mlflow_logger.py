"""Lightning's MLFlowLogger, able to continue a run that another session started.

MLflow refuses to change a logged parameter, so resuming with ``trainer.max_steps=40`` after 20
failed: the new value goes to the tag ``resumed/<key>``.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from lightning.fabric.utilities.logger import _convert_params, _flatten_dict
from lightning.pytorch.loggers import MLFlowLogger as LightningMLFlowLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities.rank_zero import rank_zero_only, rank_zero_warn
from typing_extensions import override

# Lightning's MLFlowLogger cuts each value to this many characters before logging it.
VALUE_CHARS = 250
BATCH = 100  # MLflow's limit of params or tags in one log_batch


class MLFlowLogger(LightningMLFlowLogger):
    """:class:`lightning.pytorch.loggers.MLFlowLogger` (same arguments) whose run may be continued:
    ``run_id`` names a run of an earlier session (laptrain.loggers.continued_runs passes it back)."""

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        continued = not self._initialized and self._run_id is not None
        if continued and not self._run_exists(self._run_id):
            rank_zero_warn(
                f"MLflow run {self._run_id} is not in {self._tracking_uri} (deleted, or another "
                "store): starting a new run"
            )
            self._run_id, continued = None, False
        client = super().experiment
        if continued:
            client.update_run(self._run_id, status="RUNNING")
        return client

    def _run_exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            run = self._mlflow_client.get_run(run_id)
        except MlflowException:
            return False
        return run.info.lifecycle_stage != "deleted"

    @override
    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace) -> None:
        from mlflow.entities import Param, RunTag

        flat = _flatten_dict(_convert_params(params))
        values = {str(k): str(v)[:VALUE_CHARS] for k, v in flat.items()}
        logged = self.experiment.get_run(self.run_id).data.params
        new = [Param(k, v) for k, v in values.items() if k not in logged]
        changed = [RunTag(f"resumed/{k}", v) for k, v in values.items() if logged.get(k, v) != v]
        for i in range(0, len(new), BATCH):
            self.experiment.log_batch(
                self.run_id, params=new[i : i + BATCH], **self._log_batch_kwargs
            )
        for i in range(0, len(changed), BATCH):
            self.experiment.log_batch(
                self.run_id, tags=changed[i : i + BATCH], **self._log_batch_kwargs
            )
