"""Float32 EMA of the trainable weights, for models with manual optimization (TRM).

Gap it fills relative to Lightning 2.6.6's ``WeightAveraging`` / ``EMAWeightAveraging`` (read in
``lightning/pytorch/callbacks/weight_averaging.py``): after ``fit``, ``trainer.test(ckpt_path="best")``
on the same Trainer restores the *raw* weights, because its ``on_load_checkpoint`` reloads
``current_model_state`` whenever an averaged model exists, so the test would not use the EMA; and it
has no decay warm-up, which short runs need (TRM.md §3/§9: a plain 0.99/0.999 EMA stayed useless
for the first few hundred steps). It also deep-copies the whole LightningModule; this one keeps a
float32 copy of the trainable parameters only.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override


class EMA(Callback):
    """Exponential moving average of the trainable weights, updated after every optimizer step.

    Validation runs on the EMA weights; a checkpoint's ``state_dict`` holds the EMA weights (so the
    "best" checkpoint, ``trainer.test(ckpt_path="best")`` and exported weights use them) and this
    callback's state holds the raw weights, the update count and the last step, so a resumed fit
    continues bit-identically. After ``fit`` the module keeps the EMA weights.

    Args:
        decay: target decay (e.g. 0.999 for TRM's paper size, 0.99 for short runs).
        warmup: ramp the decay as ``min(decay, (1 + t) / (10 + t))`` over update count t, so the
            average follows the weights early in short runs.

    Raises:
        ValueError: ``decay`` is not in [0, 1).
    """

    def __init__(self, decay: float = 0.999, warmup: bool = True) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay={decay} must be in [0, 1); set model ema_decay")
        self.decay = decay
        self.warmup = warmup
        self.updates = 0
        self.last_step = 0
        self.shadow: dict[str, torch.Tensor] = {}
        self._module: pl.LightningModule | None = None
        self._fitting = False
        self._backup: dict[str, torch.Tensor] = {}

    def current_decay(self) -> float:
        if not self.warmup:
            return self.decay
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    def _params(self) -> dict[str, torch.nn.Parameter]:
        assert self._module is not None
        return {n: p for n, p in self._module.named_parameters() if n in self.shadow}

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._module = pl_module
        if stage == "fit":
            self._fitting = True
            self.shadow = {
                n: p.detach().float().clone()
                for n, p in pl_module.named_parameters()
                if p.requires_grad
            }

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._fitting = False

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        if trainer.global_step <= self.last_step:
            return
        names = list(self.shadow)
        params = self._params()
        weight = 1.0 - self.current_decay()
        torch._foreach_lerp_(
            [self.shadow[n] for n in names],
            [params[n].detach().float() for n in names],
            weight,
        )
        self.updates += 1
        self.last_step = trainer.global_step

    def _copy_into_module(self, values: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, param in self._params().items():
                param.copy_(values[name].to(device=param.device, dtype=param.dtype))

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._fitting and self.shadow:
            self._backup = {n: p.detach().clone() for n, p in self._params().items()}
            self._copy_into_module(self.shadow)

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._backup:
            self._copy_into_module(self._backup)
            self._backup = {}

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.shadow:
            self._copy_into_module(self.shadow)

    @override
    def state_dict(self) -> dict[str, Any]:
        if not (self._fitting and self.shadow):
            return {}
        raw = {n: p.detach().cpu().clone() for n, p in self._params().items()}
        if self._backup:
            raw = {n: t.cpu().clone() for n, t in self._backup.items()}
        return {
            "version": 1,
            "decay": self.decay,
            "updates": self.updates,
            "last_step": self.last_step,
            "raw_weights": raw,
        }

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if not (self._fitting and self.shadow):
            return
        state = checkpoint["state_dict"]
        for name, value in self.shadow.items():
            state[name] = value.detach().cpu().clone().to(state[name].dtype)

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if not self._fitting:
            return
        state = checkpoint["state_dict"]
        self.shadow = {
            n: state[n].detach().float().clone().to(t.device) for n, t in self.shadow.items()
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not (self._fitting and state_dict):
            return
        self.updates = int(state_dict["updates"])
        self.last_step = int(state_dict["last_step"])
        self._copy_into_module(state_dict["raw_weights"])
