"""``model.gradient_checkpointing``: true, false or auto, for every family that wraps a transformers
model.

``auto`` lets the memory preflight decide (recomputing costs about a third more compute); the
non-reentrant variant, since the reentrant one gives the first layer's adapters no gradient under
frozen embeddings (transformers#26377). On MPS torch's checkpoint does not restore the device
generator (torch/utils/checkpoint.py; pytorch#127676): :func:`replay_device_rng` replays it
(docs/hardware.md §17).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from laptrain.config.batch_request import AUTO


@runtime_checkable
class ChecksGradientCheckpointing(Protocol):
    """A module whose ``gradient_checkpointing`` setting may be ``auto``, decided after it is
    built: the run asks ``checkpointing_setting`` and calls ``use_gradient_checkpointing``."""

    checkpointing_setting: bool | str

    def use_gradient_checkpointing(self) -> None: ...


def parse_setting(value: Any) -> bool | str:
    """True, False or ``"auto"``; anything else is one line naming the option."""
    if isinstance(value, bool):
        return value
    if str(value).lower() == AUTO:
        return AUTO
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise ValueError(f"model.gradient_checkpointing must be true, false or auto (got {value!r})")


def switch_on(model: nn.Module, kwargs: Mapping[str, Any] | None = None) -> None:
    """transformers' checkpointing switch under its current name (``activation_checkpointing_enable``
    from 5.23; the old ``gradient_checkpointing_enable`` warns on every call there) or the old one
    on an older transformers."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def enable_checkpointing(model: nn.Module) -> None:
    """Non-reentrant checkpointing on a transformers model, inputs requiring grad, MPS masks
    replayed."""
    switch_on(model, {"use_reentrant": False})
    model.enable_input_require_grads()
    replay_device_rng(model)


# ----- the device generator on recompute (pytorch#127676) ----------------------------------------
ContextFn = Callable[[], tuple[AbstractContextManager[Any], AbstractContextManager[Any]]]

#: Device types whose generator torch's checkpoint does not put back for the recompute, with the
#: module whose ``get_rng_state`` / ``set_rng_state`` reads and sets it. torch stashes a device's
#: generator only if that module has ``_initialized``; ``torch.mps`` has none (torch 2.13).
UNSTASHED_DEVICE_RNG: dict[str, Any] = {"mps": torch.mps}


class _RecordState:
    """Forward context: the generator state at the start of the checkpointed forward."""

    def __init__(self, get_state: Callable[[], torch.Tensor]) -> None:
        self.get_state = get_state
        self.state: torch.Tensor | None = None

    def __enter__(self) -> None:
        self.state = self.get_state()

    def __exit__(self, *exc: object) -> None:
        return None


class _ReplayState:
    """Recompute context: the recorded state for the recompute, the then-current one after it
    (also when the recompute stops early or fails), so the rest of the step draws as it would
    have without checkpointing. Re-enterable: a second backward recomputes again."""

    def __init__(
        self,
        record: _RecordState,
        get_state: Callable[[], torch.Tensor],
        set_state: Callable[[torch.Tensor], None],
    ) -> None:
        self.record = record
        self.get_state = get_state
        self.set_state = set_state
        self.saved: list[torch.Tensor] = []

    def __enter__(self) -> None:
        if self.record.state is None:
            raise RuntimeError("checkpoint recompute before its forward recorded the RNG state")
        self.saved.append(self.get_state())
        self.set_state(self.record.state)

    def __exit__(self, *exc: object) -> None:
        self.set_state(self.saved.pop())
        return None


def device_rng_contexts(
    get_state: Callable[[], torch.Tensor], set_state: Callable[[torch.Tensor], None]
) -> ContextFn:
    """A ``context_fn`` for non-reentrant ``checkpoint`` that replays one generator: the forward
    records its state, the recompute sets it and puts the then-current state back, so on MPS the
    recompute draws the forward's dropout masks."""

    def context_fn() -> tuple[_RecordState, _ReplayState]:
        record = _RecordState(get_state)
        return record, _ReplayState(record, get_state, set_state)

    return context_fn


def _tensor_leaves(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 3 and isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensor_leaves(item, depth + 1)
    elif depth < 3 and isinstance(value, Mapping):
        for item in value.values():
            yield from _tensor_leaves(item, depth + 1)


def checkpointed_device_type(function: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The device type of the first non-CPU tensor the checkpointed call gets (its arguments, or
    those bound into ``function`` when it is a ``functools.partial``, as transformers' layers
    pass them), else ``"cpu"``."""
    bound: tuple[Any, ...] = ()
    if isinstance(function, functools.partial):
        bound = (function.args, function.keywords)
    for tensor in _tensor_leaves((args, kwargs, *bound)):
        if tensor.device.type != "cpu":
            return tensor.device.type
    return "cpu"


def unstashed_rng_module(device_type: str) -> Any | None:
    """The module of ``device_type``'s generator if torch's checkpoint will not restore it
    itself (MPS), else None (CPU, CUDA, and MPS once ``torch.mps`` gains ``_initialized``)."""
    module = UNSTASHED_DEVICE_RNG.get(device_type)
    if module is None or getattr(module, "_initialized", False):
        return None
    return module


class ReplayDeviceRng:
    """A transformers ``_gradient_checkpointing_func`` around the one it set (``inner``): unchanged
    on CPU and CUDA, non-reentrant with :func:`device_rng_contexts` on MPS."""

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.inner = inner

    def __call__(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        module = unstashed_rng_module(checkpointed_device_type(function, args, kwargs))
        if module is None:
            return self.inner(function, *args, **kwargs)
        kwargs = {
            **kwargs,
            "use_reentrant": False,  # context_fn needs it; the classifier's default may be True
            "context_fn": device_rng_contexts(module.get_rng_state, module.set_rng_state),
        }
        return self.inner(function, *args, **kwargs)


def replay_device_rng(model: nn.Module) -> None:
    """After transformers turned checkpointing on: wrap each module's checkpoint function in
    :class:`ReplayDeviceRng` once (off MPS the calls stay transformers')."""
    for module in model.modules():
        func = module.__dict__.get("_gradient_checkpointing_func")
        if func is not None and not isinstance(func, ReplayDeviceRng):
            module._gradient_checkpointing_func = ReplayDeviceRng(func)
