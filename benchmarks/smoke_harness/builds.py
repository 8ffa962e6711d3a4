"""Each model family's smoke build at smoke-test size, for the device smoke test and the device
harness.

This is no second registry: :data:`SMOKE_BUILDS` is derived from the installed families
(:func:`laptrain.family.installed_families`), one :class:`SmokeBuild` per family with a ``smoke``
hook, keyed by the family's name. A build is how to make a fresh module and datamodule and how to
predict one batch, taken from the module that hook returns; which precisions the family refuses is
asked of the same family, the rule the launch applies. A new family is picked up by
``benchmarks/device_smoke.py`` from its ``FAMILY`` alone.

A smoke build may take the device and precision of the cell (``build(seed, steps, kind=...,
precision=...)``: laptrain's builds read their preset and decide from them whether AdamW is
fused and the LoRA base bfloat16), and its module may have ``note(kind)``, the line of the table's
legend that says what the cells run.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch

from laptrain.family import Family, installed_families

Build = Callable[..., tuple[pl.LightningModule, pl.LightningDataModule]]
Predict = Callable[[pl.LightningModule, Any], torch.Tensor]


@dataclass(frozen=True)
class SmokeBuild:
    """One model family at smoke-test size (the module its ``FAMILY.smoke`` returns).

    Attributes:
        name: the row label in the table.
        build: ``build(seed, steps)`` -> a fresh (module, datamodule) whose training epoch is
            ``steps`` batches, with validation data; the same seed gives the same weights. A build
            that takes ``kind`` and ``precision`` keywords gets the cell's (see :meth:`make`).
        predict: ``predict(module, batch)`` -> predictions for one validation batch (on the device).
        refuse: ``refuse(device_kind, precision)`` -> why the family does not run there, or None
            (the family's rule, the one the launch applies).
        callbacks: extra callbacks the family trains with (its ``configure_callbacks`` are added
            by Lightning itself).
        note: ``note(device_kind)`` -> one line of what the cells run (preset, optimizer, dtypes,
            data), printed under the table; None: no line.
    """

    name: str
    build: Build
    predict: Predict
    refuse: Callable[[str, str], str | None] | None = None
    callbacks: Callable[[], list[pl.Callback]] = field(default=list)
    note: Callable[[str], str] | None = None

    def make(
        self, seed: int, steps: int, kind: str, precision: str
    ) -> tuple[pl.LightningModule, pl.LightningDataModule]:
        """``build(seed, steps)``, given ``kind`` and ``precision`` where the build takes them."""
        params = inspect.signature(self.build).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        extra = {
            key: value
            for key, value in (("kind", kind), ("precision", precision))
            if takes_any or key in params
        }
        return self.build(seed, steps, **extra)

    def refusal(self, kind: str, precision: str) -> str | None:
        """Why this family does not run at ``precision`` on ``kind``, or None."""
        return self.refuse(kind, precision) if self.refuse is not None else None


def _from_family(family: Family) -> SmokeBuild:
    smoke = family.smoke()  # type: ignore[misc]
    return SmokeBuild(
        family.name,
        smoke.build,
        smoke.predict,
        refuse=family.refusal,
        note=getattr(smoke, "note", None),
    )


# One build per installed family with a smoke hook, by family name (what ``--families`` names); a
# test may add a build of its own to this table for one run.
SMOKE_BUILDS: dict[str, SmokeBuild] = {
    f.name: _from_family(f) for f in installed_families() if f.smoke is not None
}
