"""What the run may ask of a model beyond Lightning's hooks, as Protocols (as
``laptrain/data/contracts.py`` does for datamodules and ``laptrain/callbacks/contracts.py`` for
callbacks). A module joins by having the members; the run asks ``isinstance`` instead of probing
attribute names. ``laptrain/model/checkpointing.py`` holds the gradient-checkpointing one."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class ExportsModel(Protocol):
    """Writes what a user keeps after training (``save_pretrained`` folder, adapters) to
    ``<run>/<export_folder>/`` once the test has run on the best checkpoint."""

    export_folder: str

    def export(self, folder: str | Path, state_dict: dict[str, Any] | None = None) -> None:
        """``state_dict``: the module's whole weights when its own parameters are FSDP shards."""


@runtime_checkable
class ChunksBatches(Protocol):
    """Runs each loader batch in micro batches of ``micro_batch_size`` rows (None: whole)."""

    micro_batch_size: int | None


@runtime_checkable
class KeepsTrainableOnly(Protocol):
    """Checkpoints and exports only its trainable parameters (LoRA: the adapters, its base read
    again from ``model.pretrained``). Under FSDP only these are gathered from the ranks' shards
    (``laptrain.model.fsdp_units.trainable_state_dict``): the frozen base never is."""

    def trainable_keys(self) -> set[str]:
        """The ``state_dict`` keys of the trainable parameters."""
