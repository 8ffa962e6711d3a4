"""Find and set a run's batch size and loader settings on any module and datamodule.

The lookup is Lightning's own (``lightning.pytorch.utilities.parsing.lightning_hasattr``,
``lightning_getattr``, ``lightning_setattr``, which its batch-size finder uses): an attribute or an
``hparams`` entry, on the module or on the datamodule. Reading takes the last of module,
module.hparams, datamodule, datamodule.hparams that has the name; setting writes all of them. So a
datamodule written the lightning-hydra-template way (``self.save_hyperparameters()``, loaders built
with ``batch_size=self.hparams.batch_size``) gets the run's batch without knowing laptrain.

Lightning's functions reach the datamodule through ``model.trainer.datamodule``, which exists only
once ``fit`` has started; the plan is made before the Trainer is. :func:`_as_fit_sees_it` gives the
module a stand-in holding only the datamodule for the time of one lookup.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Protocol, runtime_checkable

from hydra.utils import get_object, instantiate
from lightning.pytorch.utilities.parsing import (
    lightning_getattr,
    lightning_hasattr,
    lightning_setattr,
)
from omegaconf import DictConfig, OmegaConf

BATCH = "batch_size"
LOADER_KNOBS = ("num_workers", "pin_memory", "persistent_workers")


@runtime_checkable
class TakesBatchSizes(Protocol):
    """A datamodule built without a batch (``data.batch_size=from_profile``) that returns a copy
    with the plan's (laptrain's own). Optional: any other gets its batch through Lightning's
    lookup."""

    def with_batch_sizes(self, batch_size: int, eval_batch_size: int | None = None) -> Any: ...


def users_datamodule(obj: Any) -> bool:
    """Whether ``obj`` is a user's LightningDataModule, whose batch and loader settings the run sets
    through Lightning's lookup (laptrain's own take them through their constructor and
    ``with_batch_sizes``)."""
    from lightning.pytorch import LightningDataModule

    return isinstance(obj, LightningDataModule) and type(obj).__module__.split(".")[0] != "laptrain"


@dataclass(frozen=True)
class Found:
    """A setting's value and where it lives, e.g. ``BlobsDataModule.hparams.batch_size``."""

    value: Any
    where: str


def _module(model: Any) -> Any:
    """``model`` when Lightning's lookup can use it (a LightningModule), else None."""
    return model if model is not None and hasattr(model, "_trainer") else None


@contextmanager
def _as_fit_sees_it(model: Any, datamodule: Any) -> Iterator[Any]:
    """``model`` with ``model.trainer.datamodule`` set, as Lightning's lookup expects. A module
    that is not a LightningModule (None: look on the datamodule only) is replaced by a stand-in
    with no attributes of its own."""
    stand_in = SimpleNamespace(datamodule=datamodule)
    if _module(model) is None:
        yield SimpleNamespace(_trainer=stand_in)
        return
    before = model._trainer
    model._trainer = stand_in
    try:
        yield model
    finally:
        model._trainer = before


def _has_hparam(obj: Any, name: str) -> bool:
    return hasattr(obj, "hparams") and name in obj.hparams


def _where(model: Any, datamodule: Any, name: str) -> str:
    """The holder Lightning reads ``name`` from: the last of module, module.hparams, datamodule,
    datamodule.hparams that has it (lightning/pytorch/utilities/parsing.py, _lightning_get_all_attr_holders
    and _lightning_get_first_attr_holder)."""
    holders = []
    for obj in (_module(model), datamodule):
        if obj is None:
            continue
        label = type(obj).__name__
        if hasattr(obj, name):
            holders.append(f"{label}.{name}")
        if _has_hparam(obj, name):
            holders.append(f"{label}.hparams.{name}")
    return holders[-1] if holders else name


def find_setting(model: Any, datamodule: Any, name: str) -> Found | None:
    """``name`` as Lightning finds it on ``model`` and ``datamodule`` (model None: the datamodule
    only), or None where neither has it."""
    with _as_fit_sees_it(model, datamodule) as seen:
        if not lightning_hasattr(seen, name):
            return None
        value = lightning_getattr(seen, name)
    return Found(value, _where(model, datamodule, name))


def set_setting(model: Any, datamodule: Any, name: str, value: Any) -> str:
    """Set ``name`` wherever Lightning finds it (model None: on the datamodule only); return
    where it is read from.

    Raises:
        AttributeError: neither has ``name``.
    """
    with _as_fit_sees_it(model, datamodule) as seen:
        lightning_setattr(seen, name, value)
    return _where(model, datamodule, name)


def build_datamodule(data: DictConfig, follows_profile: bool) -> Any:
    """The datamodule of ``data``. One whose batch follows the profile is built before the plan
    has decided it: laptrain's own with ``batch_size=None`` (it waits for ``with_batch_sizes``);
    any other with its constructor's default (``batch_size: from_profile`` is laptrain's request,
    not an argument), or 1 where the constructor requires one; the plan's batch replaces it
    before the loaders are built (laptrain.job.plan.planned_datamodule)."""
    if not follows_profile:
        return instantiate(data, _convert_="all")
    target = get_object(str(data._target_))
    if hasattr(target, "with_batch_sizes"):
        return instantiate(data, _convert_="all", batch_size=None)
    try:
        param = inspect.signature(target).parameters.get(BATCH)
    except (TypeError, ValueError):
        param = None
    if param is not None and param.default is inspect.Parameter.empty:
        return instantiate(data, _convert_="all", batch_size=1)
    plain = OmegaConf.to_container(data, resolve=True)
    assert isinstance(plain, dict)
    plain.pop(BATCH, None)
    return instantiate(plain, _convert_="all")
