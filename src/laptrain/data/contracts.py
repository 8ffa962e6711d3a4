"""What the run may ask of a datamodule beyond Lightning's own hooks, as Protocols.

A datamodule joins by having the members; the preflight asks ``isinstance(dm, KnowsLengths)``
instead of probing attribute names.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class KnowsLengths(Protocol):
    """Tokenized before the plan is made: ``longest_example`` is the most tokens one item of a
    split can put in a batch row (after packing and ``pad_to_multiple_of``, at most
    ``max_length``), which is what the memory preflight sizes activations by."""

    max_length: int

    def longest_example(self, split: str = "train") -> int: ...
