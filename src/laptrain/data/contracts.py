"""What the run may ask of a datamodule beyond Lightning's own hooks, as Protocols. None is
required: a plain ``LightningDataModule`` trains, its batch and loader settings found where
Lightning's batch-size finder looks (job/datamodule_settings.py; docs/your_model.md). A
datamodule joins a Protocol by having its members; each docstring says what it buys."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class KnowsLengths(Protocol):
    """Tokenized before the plan: ``longest_example`` is the most tokens one item of a split puts in
    a batch row (after packing and padding), which the memory preflight sizes activations by."""

    max_length: int

    def longest_example(self, split: str = "train") -> int: ...


@runtime_checkable
class SizesTheModel(Protocol):
    """Knows sizes the model is built with (vocabulary, labels, special token ids) only after
    ``setup``: the run passes ``model_kwargs()`` to the model, so the data sets them once."""

    def model_kwargs(self) -> dict[str, Any]: ...


@runtime_checkable
class SavesArtifacts(Protocol):
    """Leaves what a prediction needs beside the export (tokenizer, label names): ``laptrain
    predict``."""

    def save_artifacts(self, folder: str | Path) -> None: ...


@runtime_checkable
class LoaderSettings(Protocol):
    """Builds its own loaders with these settings, which the console and ``run_info.json`` report
    instead of the profile's (``data.num_workers`` etc. win over ``hardware.*``)."""

    num_workers: int
    persistent_workers: bool
    pin_memory: bool


@runtime_checkable
class EvaluatesInOtherBatches(Protocol):
    """Validates and tests in batches of ``eval_batch_size`` (None: the training batch)."""

    eval_batch_size: int | None


@runtime_checkable
class ShardsItself(Protocol):
    """``shards_itself = True``: its loaders give each process its share and its train loader saves
    its position (laptrain's, through data/sampler.py), so the run turns Lightning's distributed
    sampler off; any other datamodule gets it and a resumable train loader
    (data/user_loaders.py)."""

    shards_itself: bool


@dataclass(frozen=True)
class Loader:
    """The loader settings a run reports: the datamodule's own, else the hardware profile's."""

    num_workers: int
    persistent_workers: bool
    pin_memory: bool


def loader_settings(datamodule: object, profile: Mapping[str, Any]) -> Loader:
    """:class:`LoaderSettings` of ``datamodule`` when it has them, else ``hardware.*``."""
    if isinstance(datamodule, LoaderSettings):
        own = datamodule
        return Loader(int(own.num_workers or 0), bool(own.persistent_workers), bool(own.pin_memory))
    return Loader(
        int(profile.get("num_workers", 0) or 0),
        bool(profile.get("persistent_workers", False)),
        bool(profile.get("pin_memory", False)),
    )
