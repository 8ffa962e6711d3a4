"""What the run may ask of a model beyond Lightning's own API, as Protocols.

Nothing here is required (docs/your_model.md): a module joins a Protocol by having its members, and
each buys one feature, named in its docstring.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class ExportsModel(Protocol):
    """Writes what a user keeps after training (``save_pretrained`` folder, adapters) to
    ``<run>/<export_folder>/`` once the test has run on the best checkpoint.

    Buys: export. Without it the best checkpoint (``checkpoints/best-step*.ckpt``) is what a run
    keeps."""

    export_folder: str

    def export(self, folder: str | Path, state_dict: dict[str, Any] | None = None) -> None:
        """``state_dict``: the module's whole weights when its own parameters are FSDP shards."""


@runtime_checkable
class ChunksBatches(Protocol):
    """Runs each loader batch in micro batches of ``micro_batch_size`` rows (None: whole).

    Buys: the plan, the console and the accumulation count the micro batch the step really runs
    (TRM's carry slots), not the loader's batch."""

    micro_batch_size: int | None


@runtime_checkable
class KeepsTrainableOnly(Protocol):
    """Checkpoints and exports only its trainable parameters (LoRA: the adapters, its base read
    again from ``model.pretrained``). Under FSDP only these are gathered from the ranks' shards
    (``laptrain.model.fsdp_units.trainable_state_dict``): the frozen base never is.

    Buys: small checkpoints and exports, and no gathering of frozen weights under FSDP."""

    def trainable_keys(self) -> set[str]:
        """The ``state_dict`` keys of the trainable parameters."""


@runtime_checkable
class SizesItsStep(Protocol):
    """Makes the sample batches the memory preflight measures, and their loss, as its own
    ``training_step`` would: a DPO step runs two sequences per example and a reference pass, which
    the preflight's default (one causal-LM sequence per example, the model's own loss) undercounts.

    Buys: the preflight's estimate (and ``batch_size: auto``) of the step the module runs."""

    def preflight_batch(self, batch_size: int, seq_len: int) -> Any:
        """A batch of ``batch_size`` examples of ``seq_len`` tokens, on the CPU."""

    def preflight_loss(self, batch: Any) -> Any:
        """The scalar loss ``training_step`` would back-propagate for ``batch``."""
