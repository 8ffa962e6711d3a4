"""Stop at the first NaN/inf loss or gradient, before it reaches the weights, or skip that step.

Gap filled: Lightning has no guard of its own (``detect_anomaly`` is a debugging tool that slows every
step several times, and ``EarlyStopping(check_finite=True)`` looks only at a validation metric, after
the weights are already NaN). A non-finite update makes every later step and checkpoint useless; a
NaN model can even rank as "best" (an argmax over NaN logits still gives an accuracy). This guard
looks at the loss before ``backward`` and at the gradients before the optimizer step:

- ``action=stop`` (default): raise :class:`NonFiniteLoss` at once. Nothing of that step is applied
  or saved, so ``last.ckpt`` is the last good state; the one-line error names the step, that
  checkpoint and the likely causes for this run.
- ``action=skip``: drop the step (every gradient set to None, which torch optimizers skip), count it,
  and train on; the report lists the skipped steps.

Under 16-mixed a GradScaler already skips steps whose gradients overflow (and lowers its scale), so
the gradients are not checked there; the loss still is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn

from laptrain.callbacks.contracts import VersionedState

ACTIONS = ("stop", "skip")


class NonFiniteLoss(ValueError):
    """The loss or the gradients of a step are NaN or infinite; nothing of that step was saved."""


class NonFiniteGuard(VersionedState, Callback):
    """Args:
    action: "stop" or "skip" (see the module doc).
    last_ckpt: the run's resume checkpoint (``paths.last_ckpt``), named in the error as the last
        good state.
    check_grads: also check the gradients before each optimizer step (one device sync per step).
    """

    STATE_VERSION = 1
    STATE_NAME = "nonfinite_guard"
    STATE_RESETS = "the skip count"
    report_section = "nonfinite"

    def __init__(
        self, action: str = "stop", last_ckpt: str | None = None, check_grads: bool = True
    ):
        if action not in ACTIONS:
            raise ValueError(
                f"callbacks.nonfinite_guard.action={action!r}: choose one of {', '.join(ACTIONS)}"
            )
        self.action = action
        self.last_ckpt = last_ckpt
        self.check_grads = check_grads
        self.skipped: list[dict[str, Any]] = []
        self._bad: str | None = None

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        if bool(torch.isfinite(loss.detach()).all()):
            return
        what = f"loss is {_kind(loss)}"
        if self.action == "stop":
            raise NonFiniteLoss(self._message(trainer, pl_module, what))
        self._bad = what

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        what, self._bad = self._bad, None
        if what is None and self.check_grads and not _has_grad_scaler(trainer):
            grads = [
                p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None
            ]
            if grads and not _all_finite(grads):
                what = "gradients are not finite"
                if self.action == "stop":
                    raise NonFiniteLoss(self._message(trainer, pl_module, what))
        if what is None:
            return
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
        self.skipped.append({"step": trainer.global_step, "why": what})
        rank_zero_warn(
            f"nonfinite: {what} at step {trainer.global_step}: step skipped "
            f"({len(self.skipped)} so far; callbacks.nonfinite_guard.action=skip)"
        )

    def _message(self, trainer: pl.Trainer, pl_module: pl.LightningModule, what: str) -> str:
        loop = trainer.fit_loop.epoch_loop
        where = f"global step {trainer.global_step} (epoch {trainer.current_epoch}, batch {loop.batch_idx})"
        causes = []
        optimizers = trainer.optimizers
        if optimizers:
            lr = optimizers[0].param_groups[0].get("lr")
            if lr is not None:
                causes.append(f"the learning rate {lr:.3g} (try 10x lower: model.optimizer.lr)")
        precision = str(trainer.precision)
        if precision.startswith("16"):
            causes.append(f"16-bit overflow (precision {precision}: try bf16-mixed or 32-true)")
        causes.append("a bad row in this batch (inputs or labels)")
        return (
            f"{what} at {where}; nothing of this step was saved. Last good checkpoint: "
            f"{self._last_good()}. Likely causes: {'; '.join(causes)}. "
            "callbacks.nonfinite_guard.action=skip skips such steps instead"
        )

    def _last_good(self) -> str:
        if not self.last_ckpt:
            return "none (no checkpoint folder)"
        last = Path(self.last_ckpt)
        if not last.is_file():
            return "none yet (rerunning starts over)"
        try:
            step = torch.load(last, map_location="cpu", weights_only=True, mmap=True)["global_step"]
        except Exception:
            return str(last)
        return f"{last} (step {step}; rerun the same command to resume from it)"

    def summary(self) -> dict[str, Any]:
        return {"action": self.action, "skipped_steps": len(self.skipped), "skipped": self.skipped}

    def saved_state(self) -> dict[str, Any]:
        return {"skipped": list(self.skipped)}

    def restore_state(self, state_dict: Mapping[str, Any]) -> None:
        self.skipped = list(state_dict.get("skipped", []))


def _kind(t: torch.Tensor) -> str:
    value = float(t.detach().float().flatten()[0]) if t.numel() else math.nan
    return "nan" if math.isnan(value) else "inf" if math.isinf(value) else "not finite"


def _all_finite(grads: list[torch.Tensor]) -> bool:
    """Whether every gradient is finite: the sum of the per-tensor norms (one fused pass, one
    device sync) is finite exactly when they all are (a sum of finite norms reaching float32's
    maximum, ~3e38, counts as not finite too). Half the cost of stacking float copies and taking
    their norm (benchmarks/overhead.py)."""
    return bool(torch.isfinite(torch.stack(torch._foreach_norm(grads)).float().sum()))


def _has_grad_scaler(trainer: pl.Trainer) -> bool:
    """16-mixed: Lightning's MixedPrecision plugin keeps a GradScaler that skips overflowing steps."""
    return getattr(trainer.precision_plugin, "scaler", None) is not None
