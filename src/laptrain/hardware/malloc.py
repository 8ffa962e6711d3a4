"""``hardware.malloc_keep_freed``: glibc's malloc keeps the memory a training step frees.

With glibc's defaults a CPU step gets fresh pages for its activations each time (large blocks are
unmapped on free, the heap top trimmed), and the kernel zeroes every new page inside the op that
first writes it (docs/hardware.md §9c). glibc reads ``MALLOC_MMAP_MAX_`` /
``MALLOC_TRIM_THRESHOLD_`` only at process start, so this sets them with ``mallopt(3)``
(``M_MMAP_MAX`` 0, ``M_TRIM_THRESHOLD`` -1; constants from glibc's ``malloc/malloc.h``; 1 on
success). Linux with glibc only; a no-op elsewhere. This module must not import torch (it runs
before it).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from typing import Any, Protocol

M_TRIM_THRESHOLD = -1  # glibc malloc/malloc.h
M_MMAP_MAX = -4  # glibc malloc/malloc.h
# (parameter, value): no mmap for large blocks, never trim the heap (mallopt(3)).
KEEP_FREED = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1))
# Variables glibc read at this process's start: the user's own malloc settings win over the profile.
USER_VARS = (
    "MALLOC_MMAP_MAX_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
)


class Libc(Protocol):
    """What this module calls on the C library (``ctypes.CDLL``, or a test double)."""

    def mallopt(self, param: int, value: int) -> int: ...


def glibc_version() -> str | None:
    """``"glibc 2.36"`` on a glibc system, None elsewhere (macOS, musl, Windows): ``confstr``'s
    ``_CS_GNU_LIBC_VERSION`` exists only where glibc answers it."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        return None
    return text if text and text.startswith("glibc") else None


def user_setting(environ: Mapping[str, str]) -> str | None:
    """The malloc variable the user exported before this process started, if any."""
    for name in USER_VARS:
        if name in environ:
            return name
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    return None


def keep_freed(
    enabled: Any,
    libc: Libc | None = None,
    environ: Mapping[str, str] = os.environ,
    version: str | None = None,
) -> str:
    """Apply ``hardware.malloc_keep_freed`` to this process; returns what happened, one phrase
    (``"applied"`` or why not). Never raises: a platform without glibc's mallopt is a no-op."""
    if enabled is not True:
        return "off"
    if (version or glibc_version()) is None:
        return "no glibc (a no-op here)"
    exported = user_setting(environ)
    if exported:
        return f"{exported} is exported: glibc uses yours"
    lib: Any = libc if libc is not None else ctypes.CDLL(None)
    refused = [p for p, value in KEEP_FREED if lib.mallopt(p, value) != 1]
    return f"mallopt refused {refused}" if refused else "applied"
