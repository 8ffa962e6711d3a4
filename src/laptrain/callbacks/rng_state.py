"""Carry the random number generators' states in the checkpoint (docs/lightning.md, "RNG state").

Lightning 2.6.6 checkpoints hold no RNG state (``dump_checkpoint``,
lightning/pytorch/trainer/connectors/checkpoint_connector.py): every rank's generators, gathered
per save; a job requeued on fewer GPUs restores what exists (``set_rng_state_all`` raised
``IndexError``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
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
        state = _local_state()
        world = _world_size()
        if world == 1:
            return state
        gathered: list[Any] = [None] * world
        torch.distributed.all_gather_object(gathered, state)
        return {"ranks": gathered}

    def restore_state(self, state: Mapping[str, Any]) -> None:
        ranks = state.get("ranks")
        if ranks is not None:
            rank = torch.distributed.get_rank() if _world_size() > 1 else 0
            # a run resumed on more processes than saved it: the extra ranks take rank 0's
            state = ranks[rank] if rank < len(ranks) else ranks[0]
        _restore_local(state)


def _world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _local_state() -> dict[str, Any]:
    """This process's python, numpy and torch (CPU, CUDA, MPS) generator states."""
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
        state["cuda_device"] = torch.cuda.current_device()
    if torch.backends.mps.is_available():
        state["mps"] = torch.mps.get_rng_state()
    return state


def _restore_local(state: Mapping[str, Any]) -> None:
    random.setstate(_tuples(state["python"]))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        _restore_cuda(state["cuda"], state.get("cuda_device"))
    if "mps" in state and torch.backends.mps.is_available():
        torch.mps.set_rng_state(state["mps"])


def _restore_cuda(saved: Sequence[torch.Tensor], saved_device: int | None) -> None:
    """Set each visible device's generator from the saved one of the same index, where both exist,
    then this process's own device from the state of the device the saving process used (the one
    its dropout drew from). Devices past either list are left as seeded. ``saved_device`` is None
    in checkpoints written before it was recorded: the devices by index only."""
    for index, device_state in enumerate(saved[: torch.cuda.device_count()]):
        torch.cuda.set_rng_state(device_state, index)
    if saved_device is not None and saved_device < len(saved):
        torch.cuda.set_rng_state(saved[saved_device], torch.cuda.current_device())


def _tuples(value: Any) -> Any:
    """``random.setstate`` needs tuples; a checkpoint round trip may give lists."""
    if isinstance(value, list | tuple):
        return tuple(_tuples(v) for v in value)
    return value
