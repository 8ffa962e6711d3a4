"""This process's own peak resident memory, since it started.

Gap filled: ``getrusage``'s ``ru_maxrss`` on Linux also holds the peak of the process that started
this one (the kernel carries the parent's high-water mark over ``exec``: ``exec_mmap`` in
fs/exec.c folds the old memory map's ``hiwater_rss`` into the process's ``maxrss``). So a rank
Lightning starts from rank 0, or a run a 3 GB test runner starts, read the parent's peak (measured
here: a child of a process holding 1 GiB read 1037 MiB; its ``VmHWM`` read 13 MiB). ``VmHWM`` in
``/proc/self/status`` is the high-water mark of this process's own memory map (proc(5)); macOS
has no ``/proc`` and its ``ru_maxrss`` (in bytes) is the fallback.
"""

from __future__ import annotations

import re
import resource
import sys
from pathlib import Path

STATUS = Path("/proc/self/status")


def status_kib(field: str, status: Path = STATUS) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmHWM``, ``VmRSS``); OSError where there is none."""
    found = re.search(rf"^{field}:\s+(\d+) kB", status.read_text(), re.MULTILINE)
    if found is None:
        raise OSError(f"{status} has no {field}")
    return int(found.group(1))


def process_peak_bytes(status: Path = STATUS) -> float:
    """The highest resident set of this process so far, in bytes."""
    try:
        return float(status_kib("VmHWM", status) * 1024)
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return float(peak if sys.platform == "darwin" else peak * 1024)
