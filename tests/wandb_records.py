"""Read what an offline W&B run wrote: the records of its ``run-<id>.wandb`` file.

wandb has no Python reader of its own any more (``wandb sync`` and its TUI read the file in
wandb-core, in Go), so this reads the format wandb-core writes: a 7-byte header (``:W&B``, a magic
number, a version), then LevelDB's log format (32 KiB blocks; each chunk a 4-byte checksum, a 2-byte
length and a type: 1 full, 2 first, 3 middle, 4 last) whose records are wandb's own protobuf
``Record`` messages (``wandb.proto.wandb_internal_pb2``).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7
CHUNK = 7  # checksum (4), length (2), type (1)


def records(path: Path) -> Iterator[Any]:
    """The ``Record`` messages of one ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, parts = HEADER, b""
    while pos + CHUNK <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK:  # the rest of a block too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + CHUNK])
        if length == 0 and kind == 0:  # zero padding
            pos += left
            continue
        parts += data[pos + CHUNK : pos + CHUNK + length]
        pos += CHUNK + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def run_view(path: Path) -> dict[str, Any]:
    """What one offline run file holds: its id, config, history rows and summary (later values
    win), each value decoded from JSON."""
    view: dict[str, Any] = {"id": None, "config": {}, "history": [], "summary": {}}

    def key(item: Any) -> str:
        return "/".join(item.nested_key) if item.nested_key else item.key

    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            view["id"] = record.run.run_id
            for item in record.run.config.update:
                view["config"][key(item)] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                view["config"][key(item)] = json.loads(item.value_json)
        elif kind == "history":
            view["history"].append({key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            for item in record.summary.update:
                view["summary"][key(item)] = json.loads(item.value_json)
    return view
