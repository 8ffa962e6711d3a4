"""A callback that makes a real model run out of memory, for end-to-end backoff tests.

``+callbacks.oom._target_=tests.oom_at.OutOfMemoryAbove +callbacks.oom.step=2
+callbacks.oom.fits=8``: from optimizer step ``step`` on, the module's transformers model (its
``model`` attribute; the hook sits on its input embeddings; a user's module without one: on the
module itself) raises torch's ``OutOfMemoryError`` for any training forward over ``fits`` samples,
as a device would for a batch too large for it.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback


class OutOfMemoryAbove(Callback):
    def __init__(self, step: int, fits: int) -> None:
        self.step, self.fits = step, fits
        self.raised = 0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        model = getattr(pl_module, "model", None)
        embeddings = model.get_input_embeddings() if model is not None else pl_module

        def oom_above_fits(module: Any, inputs: tuple) -> None:
            rows = inputs[0].shape[0]
            late = trainer.global_step + 1 >= self.step
            if pl_module.training and late and rows > self.fits:
                self.raised += 1
                raise torch.OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate 2.00 GiB ({rows} samples)"
                )

        embeddings.register_forward_pre_hook(oom_above_fits)
