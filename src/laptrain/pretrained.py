"""Loading from the Hugging Face hub or a ``save_pretrained`` folder, with a one-line failure."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def from_pretrained(load: Callable[[str], T], name_or_path: str, what: str, fix: str) -> T:
    """``load(name_or_path)``; an OSError becomes one line saying whether a folder or a hub name
    (perhaps offline) failed, and ``fix``."""
    try:
        return load(name_or_path)
    except OSError as err:
        where = "folder" if Path(name_or_path).exists() else "hub name (offline?)"
        raise OSError(
            f"cannot load {what} {name_or_path!r} as a {where}: {fix} ({err.__class__.__name__})"
        ) from None
