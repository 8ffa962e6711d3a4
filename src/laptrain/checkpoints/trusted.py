"""The objects a checkpoint may hold besides tensors and plain values: those the run's own config
builds, loaded with ``weights_only=True`` and exactly those allowed.

A lightning-hydra-template module pickles its ``net`` and ``_partial_`` optimizer into
``hyper_parameters``, which torch's restricted unpickler refuses; they come from the user's config,
so those classes are allowed for one load (``torch.serialization.safe_globals``).
"""

from __future__ import annotations

import functools
import pickle
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_object
from torch import nn

# torch's WeightsUnpickler names the global it refused: "Unsupported global: GLOBAL mod.Name was not
# an allowed global by default" (torch/_weights_only_unpickler.py).
REFUSED = re.compile(r"GLOBAL (\S+) was not an allowed global")


class RefusedGlobal(ValueError):
    """A checkpoint holds an object its run's config does not build (one line: the fix)."""


def qualified(obj: Any) -> str:
    """``module.QualName`` of a class or function, as a pickle names it."""
    return f"{obj.__module__}.{obj.__qualname__}"


@dataclass(frozen=True)
class TrustedGlobals:
    """The classes and callables a run's checkpoints may hold (``allowed``), and for every object
    in the module's and datamodule's hyperparameters the ``__init__`` argument that holds it
    (``holders``: qualified name -> argument), to name in a refusal."""

    allowed: tuple[Any, ...] = ()
    holders: Mapping[str, str] = field(default_factory=dict)

    @contextmanager
    def loading(self, path: str | Path) -> Iterator[None]:
        """A ``weights_only=True`` load of ``path`` with :attr:`allowed` allowed; a global that is
        not becomes one :class:`RefusedGlobal` line naming it and the fix."""
        try:
            with torch.serialization.safe_globals(list(self.allowed)):
                yield
        except pickle.UnpicklingError as err:
            found = REFUSED.search(str(err))
            if found is None:
                raise
            raise RefusedGlobal(self.refusal(path, found.group(1))) from err

    def refusal(self, path: str | Path, name: str) -> str:
        argument = self.holders.get(name, "<the __init__ argument that holds it>")
        return (
            f"{path} holds a {name}, which this run's config does not build, so it is not "
            "loaded (checkpoints are read with weights_only=True): build it from the config "
            "(a _target_ entry), or keep it out of the checkpoints with "
            f'self.save_hyperparameters(ignore=["{argument}"]) in your module\'s __init__'
        )


def trusted_globals(sections: list[Any], *built: Any) -> TrustedGlobals:
    """The classes and callables the ``_target_`` entries of ``sections`` (the composed ``model``
    and ``data`` configs) name, and what the objects they built name in a pickle: the layers of a
    network, the partial of a ``_partial_: true`` entry (Hydra's own ``functools.partial``
    subclass), found among the hyperparameters of ``built`` (the module and datamodule)."""
    targets: set[Any] = set()
    for section in sections:
        targets |= _targets(section)
    allowed = set(targets)
    holders: dict[str, str] = {}
    for obj in built:
        for argument, value in dict(getattr(obj, "hparams", None) or {}).items():
            for kind in _globals_in(value):
                holders.setdefault(qualified(kind), argument)
            allowed |= _built_by(value, targets)
    return TrustedGlobals(tuple(sorted(allowed, key=qualified)), holders)


def _targets(node: Any) -> set[Any]:
    """The objects the ``_target_`` entries under ``node`` name."""
    if isinstance(node, Mapping):
        found = {get_object(node["_target_"])} if isinstance(node.get("_target_"), str) else set()
        return found.union(*(_targets(value) for value in node.values()))
    if isinstance(node, list | tuple):
        return set().union(*(_targets(value) for value in node))
    return set()


def _built_by(value: Any, targets: set[Any]) -> set[Any]:
    """What a pickle of ``value`` names besides ``targets``, where one of them built it: the
    layer classes of a network, the class of a partial."""
    if isinstance(value, Mapping):
        return set().union(*(_built_by(v, targets) for v in value.values()))
    if isinstance(value, list | tuple):
        return set().union(*(_built_by(v, targets) for v in value))
    if isinstance(value, functools.partial) and value.func in targets:
        return {type(value)} | _built_by([*value.args, *value.keywords.values()], targets)
    if isinstance(value, nn.Module) and type(value) in targets:
        return {type(layer) for layer in value.modules()}
    return set()


def _globals_in(value: Any) -> set[Any]:
    """The classes and callables a pickle of ``value`` names: its type (not a plain value's), the
    layers of a network, a partial's class and what it wraps, through dicts, lists and tuples."""
    if isinstance(value, Mapping):
        return set().union(*(_globals_in(v) for v in value.values()))
    if isinstance(value, list | tuple):
        return set().union(*(_globals_in(v) for v in value))
    if isinstance(value, functools.partial):
        inner = _globals_in([*value.args, *value.keywords.values()])
        return {type(value), value.func} | inner
    if isinstance(value, nn.Module):
        return {type(layer) for layer in value.modules()}
    if value is None or isinstance(value, str | int | float | bool | torch.Tensor):
        return set()
    return {value if isinstance(value, type) else type(value)}
