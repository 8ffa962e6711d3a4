"""Find and set a run's batch size and loader settings on any module and datamodule.

Lightning's own lookup (``lightning_hasattr``/``getattr``/``setattr``,
lightning/pytorch/utilities/parsing.py): an attribute or ``hparams`` entry, so a
lightning-hydra-template datamodule gets the run's batch without knowing laptrain. One that splits
``batch_size`` per device in ``setup`` is read per device and set times the process count.
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
PER_DEVICE = "batch_size_per_device"  # lightning-hydra-template's: batch_size // world_size
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


def splits_its_batch(datamodule: Any) -> bool:
    """Whether ``datamodule`` is a user's that splits its batch over the processes into
    ``batch_size_per_device`` (lightning-hydra-template's), the batch its loaders use."""
    return users_datamodule(datamodule) and hasattr(datamodule, PER_DEVICE)


def set_up(datamodule: Any, processes: int, follows_profile: bool) -> None:
    """``datamodule.setup("fit")`` before the Trainer exists, showing it ``processes`` as
    ``trainer.world_size``: a batch it splits is split now as fit will; a batch that follows the
    profile is split once set (:func:`set_setting`)."""
    splits = splits_its_batch(datamodule)
    stand_in = SimpleNamespace(world_size=processes)
    if splits and not follows_profile:
        datamodule.trainer = stand_in
    datamodule.setup("fit")
    if splits:
        datamodule.trainer = stand_in


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
    datamodule.hparams that has it (``_lightning_get_all_attr_holders``, utilities/parsing.py)."""
    if name == BATCH and splits_its_batch(datamodule):
        return f"{type(datamodule).__name__}.{PER_DEVICE}"
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
    if name == BATCH and splits_its_batch(datamodule):
        value = getattr(datamodule, PER_DEVICE)
    return Found(value, _where(model, datamodule, name))


def set_setting(model: Any, datamodule: Any, name: str, value: Any) -> str:
    """Set ``name`` wherever Lightning finds it (model None: on the datamodule only) and return
    where it is read from; a splitting datamodule's batch gets ``value`` times its processes. Raises
    AttributeError when neither has ``name``."""
    processes = 1
    if name == BATCH and splits_its_batch(datamodule):
        processes = getattr(datamodule.trainer, "world_size", 1)
        setattr(datamodule, PER_DEVICE, value)
    with _as_fit_sees_it(model, datamodule) as seen:
        lightning_setattr(seen, name, value * processes)
    return _where(model, datamodule, name)


def build_datamodule(data: DictConfig, follows_profile: bool) -> Any:
    """The datamodule of ``data``. One whose batch follows the profile is built before the plan
    decided it: laptrain's own with ``batch_size=None``, any other with its constructor's default
    (or 1 where required), replaced by the plan's batch before its loaders are built
    (``planned_datamodule``)."""
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
