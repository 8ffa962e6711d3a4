"""Stop before the first step when the module's own optimizer unscales itself where that trains
wrongly (16-mixed under FSDP, or on MPS): ``without_unsafe_fused`` covers laptrain's presets, but
a user's ``configure_optimizers`` is out of reach; its fused AdamW under FSDP let the ranks'
scales drift apart silently (docs/hardware.md §3)."""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.fabric.plugins.precision.amp import _optimizer_handles_unscaling
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from laptrain.config.check import ConfigError


class FusedOptimizerCheck(Callback):
    """Raise :class:`ConfigError` at the start of fit when an optimizer the module built unscales
    its own gradients (a fused Adam/AdamW: Lightning's ``_optimizer_handles_unscaling``);
    ``risk`` says why that trains wrongly on this run."""

    def __init__(self, risk: str) -> None:
        self.risk = risk

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for optimizer in trainer.optimizers:
            if _optimizer_handles_unscaling(optimizer):
                raise ConfigError(
                    f"{type(pl_module).__name__}.configure_optimizers builds "
                    f"{type(optimizer).__name__}(fused=True) {self.risk}: build it with "
                    "fused=False"
                )
