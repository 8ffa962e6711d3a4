"""What the run may ask of a datamodule beyond Lightning's own hooks, as Protocols.

Nothing here is required: a plain ``LightningDataModule`` trains under ``python train.py``; its
batch and loader settings are found where Lightning's batch-size finder looks (an attribute or an
``hparams`` entry: ``laptrain/job/datamodule_settings.py``), so one written the
lightning-hydra-template way gets the machine profile's (docs/your_model.md). A datamodule joins a
Protocol by having the members; the run, the plan and the preflight ask ``isinstance(dm,
KnowsLengths)`` and the like instead of probing attribute names. Each Protocol's docstring says
what it buys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class KnowsLengths(Protocol):
    """Tokenized before the plan is made: ``longest_example`` is the most tokens one item of a
    split can put in a batch row (after packing and ``pad_to_multiple_of``, at most
    ``max_length``), which is what the memory preflight sizes activations by.

    Buys: preflight sizing of a token model from its longest batch row."""

    max_length: int

    def longest_example(self, split: str = "train") -> int: ...


@runtime_checkable
class SizesTheModel(Protocol):
    """Knows sizes the model is built with (vocabulary, labels, special token ids) only after
    ``setup``: the run passes ``model_kwargs()`` to the model's constructor.

    Buys: sizes set once, by the data, instead of repeated in the model's preset."""

    def model_kwargs(self) -> dict[str, Any]: ...


@runtime_checkable
class SavesArtifacts(Protocol):
    """Leaves files a prediction needs beside the exported model (tokenizer, label names).

    Buys: a run folder that a prediction needs nothing else beside (``laptrain predict``)."""

    def save_artifacts(self, folder: str | Path) -> None: ...


@runtime_checkable
class LoaderSettings(Protocol):
    """Builds its own loaders with these settings; the plan reports them instead of the
    profile's (``data.num_workers`` etc. win over ``hardware.*``).

    Buys: a console and ``run_info.json`` that report the loader settings really used."""

    num_workers: int
    persistent_workers: bool
    pin_memory: bool


@runtime_checkable
class EvaluatesInOtherBatches(Protocol):
    """Validates and tests in batches of ``eval_batch_size`` (None: the training batch).

    Buys: validation and test in a batch of their own size."""

    eval_batch_size: int | None


@runtime_checkable
class ShardsItself(Protocol):
    """``shards_itself = True``: its loaders give each process its own share of every batch and
    its train loader saves its own position (laptrain's datamodules, through data/sampler.py).
    The run leaves such loaders as they are, with Lightning's distributed sampler off. Any other
    datamodule gets Lightning's sampler under several processes and a train loader that resumes
    mid-epoch exactly (data/user_loaders.py)."""

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
