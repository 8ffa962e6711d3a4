"""``model.gradient_checkpointing``: true, false or auto, for every family that wraps a transformers
model.

Recomputing activations in backward saves most of their memory and costs about a third more
compute (one more forward per block). A small model on a large machine should not pay that, a 3B
model on a laptop needs it, and which one a job is depends on the data, the batch and the machine.
``auto`` therefore builds the model without it and lets the memory preflight decide: on only when
the job does not fit without it (``laptrain.preflight.batch.plan_batch``), then
:func:`enable_checkpointing` turns it on before the Trainer is built.

transformers' own switch (``gradient_checkpointing_enable``) is used as is; what this module adds is
the non-reentrant variant with input gradients on (with frozen embeddings the reentrant variant
gives the adapters of the first layer no gradient: transformers#26377) and the ``auto`` value.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

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


def enable_checkpointing(model: nn.Module) -> None:
    """Non-reentrant activation checkpointing on a transformers model, inputs requiring grad."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.23
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.enable_input_require_grads()
