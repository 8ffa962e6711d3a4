"""DataLoader workers that leave Ctrl-C and SIGTERM to the main process.

Ctrl-C reaches the whole process group: a worker that died of it fails the main process's save
("DataLoader worker (pid N) exited unexpectedly"); torch's ``_worker_loop`` and Lightning's
``pl_worker_init_function`` leave the handlers. The main process still ends its workers
(``_shutdown_workers``). A spawned worker imports torch first, so :func:`worker_context` blocks
the signals while it starts (the mask survives ``execve``) and :class:`WorkerInit` unblocks them.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from dataclasses import dataclass
from multiprocessing.context import BaseContext, SpawnContext, SpawnProcess

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class WorkerInit:
    """A DataLoader ``worker_init_fn`` (a dataclass, so spawn-started workers can pickle it)."""

    rank: int = 0

    def __call__(self, worker_id: int) -> None:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        if hasattr(signal, "pthread_sigmask"):  # blocked by worker_context's start: now ignored
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        # Lightning seeds workers only when a loader has no worker_init_fn of its own
        # (lightning/fabric/utilities/data.py:246 _auto_add_worker_init_fn, called from
        # lightning/pytorch/trainer/connectors/data_connector.py:507)
        if int(os.environ.get("PL_SEED_WORKERS", 0)):
            from lightning.fabric.utilities.seed import pl_worker_init_function

            pl_worker_init_function(worker_id, rank=self.rank)


class _SignalsHeldProcess(SpawnProcess):
    """A spawn-started process whose interpreter starts with Ctrl-C and SIGTERM blocked."""

    def start(self) -> None:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            super().start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class _SignalsHeldSpawnContext(SpawnContext):
    Process = _SignalsHeldProcess


def worker_context(start_method: str | None = None) -> BaseContext | None:
    """The ``multiprocessing_context`` for a loader whose workers run :class:`WorkerInit`: under
    spawn (``start_method``, default: this process's) one that starts them with the stop signals
    blocked; None otherwise (a forked worker has its handlers from the start, a forkserver's
    inherits the server's mask)."""
    # the default first (multiprocessing docs); get_start_method() would fix it for the process
    method = start_method or (
        multiprocessing.get_start_method(allow_none=True)
        or multiprocessing.get_all_start_methods()[0]
    )
    if method != "spawn" or not hasattr(signal, "pthread_sigmask"):
        return None
    return _SignalsHeldSpawnContext()
