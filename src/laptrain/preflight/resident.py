"""How many bytes of a model's CPU parameters the process holds in memory right now.

A memory-mapped safetensors page is resident only once read (SmolLM2-135M: 0.11 GiB of RSS for
0.50 GiB of parameters; docs/benchmarks.md, "Memory preflight"): ``/proc/self/smaps`` (proc(5))
gives each mapping's "Rss"; elsewhere a parameter counts whole.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

from torch import nn

SMAPS = Path("/proc/self/smaps")


@dataclass(frozen=True)
class FileMapping:
    start: int
    end: int
    resident: int  # bytes


def file_mappings(smaps: Path = SMAPS) -> list[FileMapping] | None:
    """The process's mappings of files, sorted by address; None where smaps cannot be read."""
    try:
        text = smaps.read_text()
    except OSError:
        return None
    mappings: list[FileMapping] = []
    current: tuple[int, int] | None = None
    for line in text.splitlines():
        head, _, rest = line.partition(" ")
        if "-" in head and not head.endswith(":"):
            fields = rest.split()
            # perms offset dev inode [path]; a file has an inode and a path not like [heap]
            path = fields[4] if len(fields) > 4 else ""
            inode = fields[3] if len(fields) > 3 else "0"
            is_file = inode != "0" and not path.startswith("[")
            low, _, high = head.partition("-")
            current = (int(low, 16), int(high, 16)) if is_file else None
        elif current is not None and head == "Rss:":
            mappings.append(FileMapping(current[0], current[1], int(rest.split()[0]) * 1024))
            current = None
    mappings.sort(key=lambda m: m.start)
    return mappings


def resident_parameter_bytes(model: nn.Module, mappings: list[FileMapping] | None) -> int:
    """Bytes of ``model``'s CPU parameters in memory now: parameters in mapped files count with
    their mappings' resident bytes (each mapping once), all others whole."""
    starts = [m.start for m in mappings or []]
    anonymous = 0
    touched: set[int] = set()
    seen: set[int] = set()
    for param in model.parameters():
        if param.device.type != "cpu":
            continue
        storage = param.untyped_storage()
        pointer = storage.data_ptr()
        if pointer in seen:
            continue
        seen.add(pointer)
        index = bisect.bisect_right(starts, pointer) - 1
        if mappings and index >= 0 and pointer < mappings[index].end:
            touched.add(index)
        else:
            anonymous += storage.nbytes()
    return anonymous + sum(mappings[i].resident for i in touched)  # touched: mappings exist
