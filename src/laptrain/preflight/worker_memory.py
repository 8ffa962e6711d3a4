"""What DataLoader worker processes cost in host memory, measured once per machine and cached.

On macOS each worker is spawned and re-imports torch (a few hundred MB of the unified memory the
model trains in); the preflight takes :func:`worker_cost` off the budget (docs/hardware.md §5,
§1b): one child with the platform's start method imports torch and reports its USS.
"""

from __future__ import annotations

import json
import multiprocessing
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from laptrain.files import write_text_atomic
from laptrain.project import default_cache_dir

GiB = 1024**3
CACHE_FILE = "worker_memory.json"


@dataclass(frozen=True)
class WorkerCost:
    """Host memory held by DataLoader workers at once."""

    processes: int
    bytes_each: float
    start_method: str

    @property
    def total(self) -> float:
        return self.processes * self.bytes_each

    def text(self) -> str:
        return (
            f"{self.processes} loader worker(s) x {self.bytes_each / GiB:.2f} GiB "
            f"({self.start_method}, measured)"
        )


def worker_processes(num_workers: int, persistent: bool) -> int:
    """Workers alive at the same time: with ``persistent_workers`` the train and the validation
    loader each keep theirs for the whole fit; without it one loader's set exists at a time."""
    return max(0, int(num_workers)) * (2 if persistent else 1)


def _report_uss(conn: object) -> None:
    """Child: import what a worker imports, collect garbage, send the unique set size."""
    import gc

    import psutil
    import torch  # noqa: F401  (a spawned DataLoader worker re-imports torch)

    gc.collect()
    conn.send(psutil.Process().memory_full_info().uss)  # type: ignore[attr-defined]
    conn.close()  # type: ignore[attr-defined]


def measure_worker_bytes(start_method: str | None = None, timeout: float = 120.0) -> float:
    """Bytes one worker process adds, measured by starting one."""
    method = start_method or multiprocessing.get_start_method(allow_none=False)
    context = multiprocessing.get_context(method)
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=_report_uss, args=(child,), daemon=True)
    process.start()
    child.close()
    try:
        if not parent.poll(timeout):
            raise TimeoutError(f"worker memory probe gave no answer in {timeout:.0f} s")
        return float(parent.recv())
    finally:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()


def _cache_key(start_method: str) -> str:
    from importlib.metadata import version

    return "|".join(
        (
            version("torch"),
            platform.python_version(),
            sys.platform,
            platform.machine(),
            start_method,
        )
    )


def worker_cost(
    num_workers: int,
    persistent: bool,
    cache_dir: Path | None = None,
    measure: Callable[[str], float] = measure_worker_bytes,
    start_method: str | None = None,
) -> WorkerCost | None:
    """The workers' memory for a loader setting; None with no workers (nothing is measured)."""
    processes = worker_processes(num_workers, persistent)
    if processes == 0:
        return None
    method = start_method or multiprocessing.get_start_method(allow_none=False)
    path = (cache_dir or default_cache_dir()) / CACHE_FILE
    key = _cache_key(method)
    try:
        known = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        known = {}
    if key not in known:
        known[key] = measure(method)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(known, indent=1))
    return WorkerCost(processes, float(known[key]), method)
