"""EMA of the trainable weights, for models with manual optimization (TRM).

Lightning 2.6.6's ``EMAWeightAveraging`` (lightning/pytorch/callbacks/weight_averaging.py) makes
``trainer.test(ckpt_path="best")`` restore the raw weights, has no decay warm-up (docs/trm.md: a
plain EMA stayed useless for the first few hundred steps) and deep-copies the whole module. This
keeps the trainable parameters only, in float32 (float64 for float64 weights), averaged by torch's
``get_ema_multi_avg_fn``. Lightning calls ``setup`` and restores a checkpoint before
``strategy.setup`` converts and moves the module (``Trainer._run``), so the shadow is built or
placed in ``on_fit_start``, the first hook after the move.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch.optim.swa_utils import get_ema_multi_avg_fn
from typing_extensions import override

from laptrain.callbacks.contracts import check_version


def shadow_dtype(param_dtype: torch.dtype) -> torch.dtype:
    """The EMA's dtype for a parameter: float32 for float32 and half weights, float64 for float64."""
    return torch.promote_types(param_dtype, torch.float32)


class EMA(Callback):
    """Exponential moving average of the trainable weights, updated after every optimizer step.

    Validation, checkpoints' ``state_dict`` (so "best", test and exports) use the EMA weights; this
    callback's state holds the raw weights, so a resumed fit continues bit-identically. ``warmup``
    ramps the decay as ``min(decay, (1 + t) / (10 + t))`` so the average follows early weights."""

    STATE_VERSION = 1

    def __init__(self, decay: float = 0.999, warmup: bool = True) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay={decay} must be in [0, 1); set model ema_decay")
        self.decay = decay
        self.warmup = warmup
        self.updates = 0
        self.last_step = 0
        self.shadow: dict[str, torch.Tensor] = {}
        self._names: list[str] = []
        self._module: pl.LightningModule | None = None
        self._fitting = False
        self._backup: dict[str, torch.Tensor] = {}
        self._pending_raw: dict[str, torch.Tensor] = {}

    def current_decay(self) -> float:
        if not self.warmup:
            return self.decay
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    def _params(self) -> dict[str, torch.nn.Parameter]:
        assert self._module is not None
        names = set(self._names)
        return {n: p for n, p in self._module.named_parameters() if n in names}

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._module = pl_module
        if stage == "fit":
            self._fitting = True
            self._names = [n for n, p in pl_module.named_parameters() if p.requires_grad]
            self.shadow = {}
            self._pending_raw = {}

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The module now has its final device and dtype (strategy.setup ran after setup/restore).
        params = self._params()
        if self._pending_raw:
            self._copy_into_module(self._pending_raw)
            self._pending_raw = {}
        with torch.no_grad():
            self.shadow = {
                n: (self.shadow[n] if n in self.shadow else p.detach()).to(
                    device=p.device, dtype=shadow_dtype(p.dtype), copy=True
                )
                for n, p in params.items()
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
        average = get_ema_multi_avg_fn(self.current_decay())  # torch's EMA step (foreach lerp)
        average(
            [self.shadow[n] for n in names],
            [params[n].detach().to(self.shadow[n].dtype) for n in names],
            None,
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
        params = self._params()
        raw = {n: p.detach().cpu().clone() for n, p in params.items()}
        if self._backup:
            raw = {n: t.cpu().clone() for n, t in self._backup.items()}
        state: dict[str, Any] = {
            "version": self.STATE_VERSION,
            "decay": self.decay,
            "updates": self.updates,
            "last_step": self.last_step,
            "raw_weights": raw,
        }
        # The checkpoint's state_dict holds the EMA in the weights' dtype; where that is narrower
        # than the EMA's (half weights), keep the full EMA here so a resume is exact.
        if any(self.shadow[n].dtype != p.dtype for n, p in params.items()):
            state["shadow"] = {n: t.detach().cpu().clone() for n, t in self.shadow.items()}
        return state

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
        # Runs before the module is moved and converted: keep the values as loaded (the weights'
        # dtype); on_fit_start puts them on the parameters' device in the EMA's dtype.
        if not self._fitting:
            return
        state = checkpoint["state_dict"]
        self.shadow = {n: state[n].detach().clone() for n in self._names}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not (self._fitting and state_dict):
            return
        if not check_version(
            "ema",
            state_dict,
            self.STATE_VERSION,
            "the update count (decay warm-up restarts; training goes on from the EMA weights)",
        ):
            self.updates, self.last_step, self._pending_raw = 0, 0, {}
            return
        self.updates = int(state_dict["updates"])
        self.last_step = int(state_dict["last_step"])
        # Copied into the module in on_fit_start, after the dtype conversion: copying them now
        # would round float64 weights through the module's float32 of this moment.
        self._pending_raw = dict(state_dict["raw_weights"])
        if "shadow" in state_dict:
            self.shadow = {n: t.detach().clone() for n, t in state_dict["shadow"].items()}
