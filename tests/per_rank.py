"""torchrun runs with a different machine per rank, and what each rank ended up training with.

torchrun gives every rank the same command. Run as torchrun's script, this file appends the
overrides ``LAPTRAIN_RANK_OVERRIDES`` (a JSON list, one list of overrides per local rank) to the
command of that rank and runs ``train.py`` (its first argument) as ``python train.py`` would: a
rank whose GPU has less free memory is a rank with a smaller ``hardware.memory_budget_gb``.

:class:`RecordPlan` (``+callbacks.plan._target_=tests.per_rank.RecordPlan
+callbacks.plan.folder=<dir>``) writes ``<dir>/rank<N>.json`` as the fit starts: the batch, the
accumulation and the gradient checkpointing this rank trains with.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback

OVERRIDES_ENV = "LAPTRAIN_RANK_OVERRIDES"


class RecordPlan(Callback):
    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        record = {
            "loader_batch": trainer.datamodule.batch_size,
            "accumulation": trainer.accumulate_grad_batches,
            "training_batches": trainer.num_training_batches,
            "checkpointing": bool(getattr(pl_module, "gradient_checkpointing", False)),
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def main() -> None:
    train, *args = sys.argv[1:]
    rank = int(os.environ["LOCAL_RANK"])
    extra = json.loads(os.environ.get(OVERRIDES_ENV, "[]"))
    args += extra[rank] if rank < len(extra) else []
    sys.path[0] = str(Path(train).resolve().parent)  # as for `python train.py`
    sys.argv = [train, *args]
    runpy.run_path(train, run_name="__main__")


if __name__ == "__main__":
    main()
