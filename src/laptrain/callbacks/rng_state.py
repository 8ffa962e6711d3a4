"""Carry the random number generators' states in the checkpoint.

Gap filled: Lightning 2.6.6 checkpoints hold no RNG state (the keys it writes are in
``lightning/pytorch/trainer/connectors/checkpoint_connector.py`` ``dump_checkpoint``), so dropout
masks and random augmentation after a resume differ from an uninterrupted run. This callback saves
the python, numpy and torch generators (CPU, every CUDA device, and MPS, whose generator is its
own: ``torch.mps.get_rng_state``) and restores them when training resumes.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from laptrain.callbacks.contracts import VersionedState


class RNGState(VersionedState, Callback):
    """Save and restore python / numpy / torch RNG states with the checkpoint."""

    STATE_VERSION = 1
    STATE_NAME = "rng_state"
    STATE_RESETS = (
        "the random generators (they keep this run's seed, so the resume is not bit-identical)"
    )

    def saved_state(self) -> dict[str, Any]:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        state = {
            "python": random.getstate(),
            # numpy arrays are not loadable with weights_only=True: store the key as a tensor.
            "numpy": [
                kind,
                torch.from_numpy(keys.astype(np.int64)),
                int(pos),
                int(has_gauss),
                float(gauss),
            ],
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        if torch.backends.mps.is_available():
            state["mps"] = torch.mps.get_rng_state()
        return state

    def restore_state(self, state: Mapping[str, Any]) -> None:
        random.setstate(_tuples(state["python"]))
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
        if "mps" in state and torch.backends.mps.is_available():
            torch.mps.set_rng_state(state["mps"])


def _tuples(value: Any) -> Any:
    """``random.setstate`` needs tuples; a checkpoint round trip may give lists."""
    if isinstance(value, list | tuple):
        return tuple(_tuples(v) for v in value)
    return value
