"""What ``laptrain predict`` gives for one text, from the torch model (``predict``) or its ONNX
export (``onnx_predict``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Prediction:
    label: str
    probability: float


def check_batch_size(value: object) -> int:
    """``value`` when it is an int >= 1, else a one-line ValueError naming ``--batch-size``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"--batch-size {value} must be a whole number >= 1, e.g. --batch-size 32")
    return value
