"""stdlib_mc's rows: ``stdlib_mc.jsonl`` beside this file, wherever lm_eval runs from (a
``data_files`` path in the YAML would be read from the current folder)."""

from pathlib import Path
from typing import Any


def load(**metadata: Any) -> Any:
    """The task's ``test`` split (``metadata``: what lm_eval passes every custom dataset)."""
    import datasets

    rows = str(Path(__file__).with_name("stdlib_mc.jsonl"))
    return datasets.load_dataset("json", data_files={"test": rows})
