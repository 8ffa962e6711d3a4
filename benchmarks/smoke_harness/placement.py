"""Check that the tensors a run keeps follow the module to its device and dtype.

Lightning 2.6.6 calls ``Callback.setup`` and restores a checkpoint *before* ``strategy.setup``
converts the module (``precision_plugin.convert_module``) and moves it (``model_to_device``):
``Trainer._run`` in lightning/pytorch/trainer/trainer.py. A tensor that a callback or module makes
in those hooks stays on the CPU in the old dtype, and the first op mixing it with the parameters
fails on MPS or CUDA. On a CPU-only machine ``precision="64-true"`` converts every parameter at the
same point, so a float32 tensor left behind shows the same bug without a GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from torchmetrics import Metric

from laptrain.families.trm.ema import EMA

# Module internals that are walked through named_parameters/named_buffers/modules instead.
_MODULE_SLOTS = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set")


def _walk(value: Any, where: str, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors in ``value``: itself, or inside dicts, lists, tuples and dataclasses (not Modules)."""
    if depth > 6:
        return
    if isinstance(value, torch.Tensor):
        yield where, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(item, f"{where}[{key!r}]", depth + 1)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _walk(item, f"{where}[{i}]", depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _walk(getattr(value, field.name), f"{where}.{field.name}", depth + 1)


def kept_tensors(
    module: torch.nn.Module, callbacks: Iterable[pl.Callback] = ()
) -> Iterator[tuple[str, torch.Tensor, bool]]:
    """Every tensor the module (buffers and plain attributes of each submodule) and the callbacks
    hold: (where it is kept, the tensor, whether its dtype must follow the parameters').

    Parameters and Lightning's own callbacks are excluded. A torchmetrics ``Metric`` keeps its states' dtype on purpose
    (``Metric._apply`` in torchmetrics/metric.py skips ``.double()``/``.half()`` unless
    ``set_dtype`` was called), so only their device must follow.
    """
    for name, buffer in module.named_buffers():
        yield f"buffer {name}", buffer, True
    for prefix, sub in module.named_modules():
        follows = not isinstance(sub, Metric)
        for attr, value in vars(sub).items():
            if attr in _MODULE_SLOTS or isinstance(value, torch.nn.Parameter):
                continue
            for where, tensor in _walk(value, f"module {prefix + '.' if prefix else ''}{attr}"):
                yield where, tensor, follows
    for callback in callbacks:
        if type(callback).__module__.startswith("lightning."):
            continue  # Lightning's own keep CPU scalars on purpose (ModelCheckpoint.kth_value)
        for attr, value in vars(callback).items():
            for where, tensor in _walk(value, f"{type(callback).__name__}.{attr}"):
                yield where, tensor, True


def placement_errors(module: torch.nn.Module, callbacks: Iterable[pl.Callback] = ()) -> list[str]:
    """What is not where the parameters are, one line each; empty when everything follows them.

    Rules: every kept tensor sits on the parameters' device; a floating tensor has the
    parameters' dtype or ``promote_types(dtype, float32)`` (float32 state beside half weights);
    an EMA shadow has exactly ``promote_types(its parameter's dtype, float32)``.
    """
    callbacks = list(callbacks)
    params = dict(module.named_parameters())
    floating = [p for p in params.values() if p.is_floating_point()]
    if not floating:
        return []
    device = floating[0].device
    dtypes = {p.dtype for p in floating}
    allowed = dtypes | {torch.promote_types(d, torch.float32) for d in dtypes}
    errors = []
    for name, p in params.items():
        if p.device != device:
            errors.append(f"parameter {name}: on {p.device}, other parameters on {device}")
    for where, tensor, follows in kept_tensors(module, callbacks):
        if tensor.device != device:
            errors.append(f"{where}: on {tensor.device}, parameters on {device}")
        if follows and tensor.is_floating_point() and tensor.dtype not in allowed:
            want = " or ".join(sorted(str(d) for d in allowed))
            errors.append(f"{where}: {tensor.dtype}, parameters want {want}")
    for callback in callbacks:
        if isinstance(callback, EMA):
            for name, shadow in callback.shadow.items():
                want = torch.promote_types(params[name].dtype, torch.float32)
                if shadow.dtype != want:
                    errors.append(
                        f"EMA.shadow[{name!r}]: {shadow.dtype}, its parameter wants {want}"
                    )
    return errors


class PlacementError(AssertionError):
    """Tensors kept by a module or callback did not follow the parameters."""


class PlacementCheck(pl.Callback):
    """Run :func:`placement_errors` at the start of training (after Lightning's move, conversion and
    checkpoint restore), after each training batch and at the end of training; raise at once."""

    def __init__(self) -> None:
        self.checks = 0

    def _check(self, trainer: pl.Trainer, pl_module: pl.LightningModule, when: str) -> None:
        others = [c for c in trainer.callbacks if c is not self]
        errors = placement_errors(pl_module, others)
        self.checks += 1
        if errors:
            shown = "\n  ".join(errors[:12])
            more = f"\n  ... and {len(errors) - 12} more" if len(errors) > 12 else ""
            raise PlacementError(
                f"{when} (global step {trainer.global_step}, precision {trainer.precision}): "
                f"{len(errors)} kept tensor(s) did not follow the parameters:\n  {shown}{more}"
            )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check(trainer, pl_module, "on_train_start")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any
    ) -> None:
        self._check(trainer, pl_module, "on_train_batch_end")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check(trainer, pl_module, "on_train_end")
