"""Each model family at smoke-test size, for the device smoke test and the device harness.

An entry is how to build a fresh module and datamodule and how to predict one batch, taken from
the family's own ``smoke`` module that the family registry names (:mod:`laptrain.model.families`);
which precisions the family refuses comes from the same registry, the rule the launch applies. A
new family is picked up by ``benchmarks/device_smoke.py`` from its registry entry alone.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch

from laptrain.model.families import FAMILIES as MODEL_FAMILIES
from laptrain.model.families import ModelFamily

Build = Callable[[int, int], tuple[pl.LightningModule, pl.LightningDataModule]]
Predict = Callable[[pl.LightningModule, Any], torch.Tensor]


@dataclass(frozen=True)
class Family:
    """One model family at smoke-test size.

    Attributes:
        name: the row label in the table.
        build: ``build(seed, steps)`` -> a fresh (module, datamodule) whose training epoch is
            ``steps`` batches, with validation data; the same seed gives the same weights.
        predict: ``predict(module, batch)`` -> predictions for one validation batch (on the device).
        refuse: ``refuse(device_kind, precision)`` -> why the family does not run there, or None
            (default: the registry's rule for ``name``).
        callbacks: extra callbacks the family trains with (its ``configure_callbacks`` are added
            by Lightning itself).
    """

    name: str
    build: Build
    predict: Predict
    refuse: Callable[[str, str], str | None] | None = None
    callbacks: Callable[[], list[pl.Callback]] = field(default=list)

    def refusal(self, kind: str, precision: str) -> str | None:
        """Why this family does not run at ``precision`` on ``kind``, or None (a family the
        registry does not know has no rule of its own unless ``refuse`` gives one)."""
        if self.refuse is not None:
            return self.refuse(kind, precision)
        family = MODEL_FAMILIES.get(self.name)
        return family.refusal(kind, precision) if family else None


def _from_registry(family: ModelFamily) -> Family:
    smoke = importlib.import_module(family.smoke)
    return Family(family.name, smoke.build, smoke.predict)


FAMILIES: dict[str, Family] = {name: _from_registry(f) for name, f in MODEL_FAMILIES.items()}


def register(family: Family) -> None:
    """Add (or replace) a smoke build, e.g. for a module of the user's own outside the registry."""
    FAMILIES[family.name] = family
