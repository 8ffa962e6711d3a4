"""DataLoader workers that leave Ctrl-C and SIGTERM to the main process.

Gap it fills: Ctrl-C in a terminal goes to the whole foreground process group, and a scheduler
(``scancel``, ``kill -TERM -<pgid>``) may signal every process of a job. A DataLoader worker keeps
Python's default handlers, so it dies at once, while the main process is asked to finish the batch,
a due validation or an accumulation window and save: its next fetch then fails with "DataLoader
worker (pid N) exited unexpectedly" and no stop checkpoint is written. Neither torch nor Lightning
changes the workers' handlers (``torch/utils/data/_utils/worker.py`` ``_worker_loop``; Lightning's
``pl_worker_init_function`` only seeds). So each worker ignores both signals; the main process still
ends its workers itself (``_MultiProcessingDataLoaderIter._shutdown_workers`` sets their done event
and joins them), and a worker whose main process is gone exits through torch's ``ManagerWatchdog``.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerInit:
    """A DataLoader ``worker_init_fn`` (a dataclass, so spawn-started workers can pickle it)."""

    rank: int = 0

    def __call__(self, worker_id: int) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # Lightning seeds workers only when a loader has no worker_init_fn of its own
        # (lightning/fabric/utilities/data.py:246 _auto_add_worker_init_fn, called from
        # lightning/pytorch/trainer/connectors/data_connector.py:507)
        if int(os.environ.get("PL_SEED_WORKERS", 0)):
            from lightning.fabric.utilities.seed import pl_worker_init_function

            pl_worker_init_function(worker_id, rank=self.rank)
