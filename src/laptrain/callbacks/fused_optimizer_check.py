"""Stop before the first step when the module's own optimizer unscales itself where that trains
wrongly: 16-mixed under FSDP, or on MPS.

laptrain turns ``model.optimizer.fused`` off for its presets there (laptrain.launch.device,
``without_unsafe_fused``), but a user's module builds its optimizer in ``configure_optimizers``,
which no config key reaches: its ``AdamW(fused=True)`` under ``trainer=fsdp`` at 16-mixed let each
rank skip steps and shrink its loss scale on its own shard's overflow, and the ranks' scales drifted
apart with no error (docs/hardware.md §3). The optimizers are known once Lightning has set them up,
so this looks at them at the start of fit and refuses in one line.
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.fabric.plugins.precision.amp import _optimizer_handles_unscaling
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from laptrain.config.check import ConfigError


class FusedOptimizerCheck(Callback):
    """Raise :class:`ConfigError` at the start of fit when an optimizer the module built unscales
    its own gradients (a fused Adam/AdamW: Lightning's ``_optimizer_handles_unscaling``).

    Args:
        risk: why that trains wrongly on this run (``with 16-mixed under FSDP: ...``).
    """

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
