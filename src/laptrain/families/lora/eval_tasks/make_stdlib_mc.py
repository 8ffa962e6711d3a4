"""Write ``stdlib_mc/stdlib_mc.jsonl``: "which module family is this docstring from?" over the
stdlib docstrings corpus (``laptrain.families.classifier.stdlib_docstrings``), with the 8 families of
``conf/data/stdlib_docstrings.yaml`` as the choices.

The file is generated once and shipped: docstrings change between Python releases, and a yardstick
scores the same items on every machine. ``python -m laptrain.families.lora.eval_tasks.make_stdlib_mc``
regenerates it (deterministic for one Python release: items picked by the hash of their text).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

from laptrain.families.classifier.stdlib_docstrings import collect_examples, write_jsonl
from laptrain.families.lora.eval_tasks import TASKS_DIR

PER_FAMILY = 40
MAX_CHARS = (
    300  # the docstring's first 300 characters: the family shows early, tiny models stay fast
)


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def stdlib_mc_rows(families: dict[str, list[str]], per_family: int = PER_FAMILY) -> list[dict]:
    """``per_family`` docstrings of each family, picked and ordered by the hash of their text."""
    rows = collect_examples(families)
    picked = []
    for label in families:
        mine = sorted((r for r in rows if r["label"] == label), key=lambda r: _key(r["text"]))
        picked += mine[:per_family]
    return [
        {"text": r["text"][:MAX_CHARS], "label": r["label"], "module": r["module"]}
        for r in sorted(picked, key=lambda r: _key(r["text"]))
    ]


def main() -> None:
    conf = Path(__file__).parents[5] / "conf" / "data" / "stdlib_docstrings.yaml"
    families = yaml.safe_load(conf.read_text())["builder"]["families"]
    write_jsonl(TASKS_DIR / "stdlib_mc" / "stdlib_mc.jsonl", stdlib_mc_rows(families))


if __name__ == "__main__":
    main()
