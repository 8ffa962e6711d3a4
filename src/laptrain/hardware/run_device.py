"""The record of what a run trains on; ``laptrain.launch.device.decide_device`` decides it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunDevice:
    """What a run trains on, decided once by :func:`decide_device` and passed down: ``kind`` (cpu,
    cuda, mps), ``precision`` (Lightning's spelling, checked), ``index`` (this rank's CUDA GPU, None
    off CUDA) and ``asked``, the config values it answers (:func:`device_request`)."""

    kind: str
    precision: str
    index: int | None
    asked: tuple[str, ...]
