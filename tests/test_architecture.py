"""docs/architecture.md's picture of the floors is what the imports say: regenerated from
``src/laptrain/`` by scripts/architecture.py and compared with the file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "architecture.py"


def architecture():
    spec = importlib.util.spec_from_file_location("architecture", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_architecture_picture_is_what_the_imports_say() -> None:
    script = architecture()
    written = script.written(script.DOC.read_text())
    assert written is not None, "docs/architecture.md lost its generated floors"
    assert written == script.picture(), (
        "docs/architecture.md's floors are not the imports: run python scripts/architecture.py"
    )


def test_every_room_is_drawn_on_its_floor() -> None:
    script = architecture()
    drawn = [room for rooms in script.floors() for room in rooms]
    rooms = {script.room_of(m) for m in script.modules() if m != "laptrain"}
    assert sorted(drawn) == sorted(rooms)
    assert len(drawn) == len(set(drawn))
