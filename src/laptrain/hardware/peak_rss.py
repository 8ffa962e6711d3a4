"""This process's own peak resident memory, since it started: on Linux ``ru_maxrss`` carries the
parent's peak over ``exec`` (``exec_mmap``, fs/exec.c; a child of a 1 GiB process read 1037 MiB,
its ``VmHWM`` 13 MiB), so ``VmHWM`` of ``/proc/self/status`` is read; macOS falls back on
``ru_maxrss`` (bytes)."""

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
