"""Stop at the first NaN/inf loss or gradient, before it reaches the weights, or skip that step.

Lightning has no such guard (``detect_anomaly`` slows every step; ``EarlyStopping(check_finite)``
sees a validation metric after the weights are NaN), and a NaN model can even rank as "best". The
losses of a step are kept on the device and checked with its gradients before the optimizer step:
one fused pass and one read from the device a step; which loss or parameter was not finite is looked
up only after it fails. ``action=stop`` raises :class:`NonFiniteLoss` with nothing of the step
applied, after keeping what it saw as ``stop`` in its report section (``laptrain why`` reads it);
``action=skip`` drops the step (:func:`_discard_step`). Under 16-mixed the GradScaler handles
overflowing gradients, and a skip goes through the scaler too (docs/lightning.md, "The NaN guard's
skip under 16-mixed"). With several processes the ranks agree in one all-reduce per optimizer step,
so all stop or skip at the same step (under FSDP a NaN is in one rank's shard only).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn

from laptrain.callbacks.contracts import VersionedState
from laptrain.checkpoints.checkpoint_io import checkpoint_step
from laptrain.checkpoints.stop import last_checkpoint_of

ACTIONS = ("stop", "skip")


class NonFiniteLoss(ValueError):
    """The loss or the gradients of a step are NaN or infinite; nothing of that step was saved."""


class NonFiniteGuard(VersionedState, Callback):
    """Options: conf/callbacks/nonfinite_guard.yaml (``action``: stop or skip; ``check_grads``)."""

    STATE_VERSION = 1
    STATE_NAME = "nonfinite_guard"
    STATE_RESETS = "the skip count"
    report_section = "nonfinite"

    def __init__(self, action: str = "stop", check_grads: bool = True):
        if action not in ACTIONS:
            raise ValueError(
                f"callbacks.nonfinite_guard.action={action!r}: choose one of {', '.join(ACTIONS)}"
            )
        self.action = action
        self.check_grads = check_grads
        self.skipped: list[dict[str, Any]] = []
        self.stopped: dict[str, Any] | None = None  # the report's ``stop`` record (module doc)
        self._losses: list[torch.Tensor] = []  # this step's losses, checked before its update

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        self._losses.append(loss.detach())

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        losses, self._losses = self._losses, []
        grads = []
        if self.check_grads and not _has_grad_scaler(trainer):
            grads = [
                p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None
            ]
        # the losses copied into one tensor: the check writes (x * 1) to what it checks
        checked = [torch.cat([loss.reshape(-1) for loss in losses])] if losses else []
        ok = _all_finite(checked + grads)
        bad = None if ok else _not_finite(losses, pl_module, optimizer if grads else None)
        bad = _agreed(trainer, bad)
        if bad is None:
            return
        what = bad[0]
        if self.action == "stop":
            self._stop(trainer, pl_module, *bad)
        _discard_step(trainer, optimizer)
        self.skipped.append({"step": trainer.global_step, "why": what})
        rank_zero_warn(
            f"nonfinite: {what} at step {trainer.global_step}: step skipped "
            f"({len(self.skipped)} so far; callbacks.nonfinite_guard.action=skip)"
        )

    def _stop(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, what: str, found: dict[str, Any]
    ) -> NoReturn:
        """Keep the stop's record, then raise: ``RunReport.on_exception`` builds the report after
        the raise, from ``summary()``, so the record must be in place first."""
        self.stopped = {
            "step": trainer.global_step,
            **found,
            "lr": _learning_rates(trainer),
            "precision": str(trainer.precision),
        }
        raise NonFiniteLoss(self._message(trainer, pl_module, what))

    def _message(self, trainer: pl.Trainer, pl_module: pl.LightningModule, what: str) -> str:
        loop = trainer.fit_loop.epoch_loop
        where = f"global step {trainer.global_step} (epoch {trainer.current_epoch}, batch {loop.batch_idx})"
        lrs = _learning_rates(trainer)
        causes = [
            f"the learning rate {lr:.3g} (try 10x lower: model.optimizer.lr)" for lr in lrs[:1]
        ]
        precision = str(trainer.precision)
        if precision.startswith("16"):
            causes.append(f"16-bit overflow (precision {precision}: try bf16-mixed or 32-true)")
        causes.append("a bad row in this batch (inputs or labels)")
        return (
            f"{what} at {where}; nothing of this step was saved. Last good checkpoint: "
            f"{_last_good(trainer)}. Likely causes: {'; '.join(causes)}. "
            "callbacks.nonfinite_guard.action=skip skips such steps instead"
        )

    def summary(self) -> dict[str, Any]:
        """The report's ``nonfinite`` section; ``stop`` only when the guard stopped the run."""
        section = {
            "action": self.action,
            "skipped_steps": len(self.skipped),
            "skipped": self.skipped,
        }
        if self.stopped is not None:
            section["stop"] = self.stopped
        return section

    def saved_state(self) -> dict[str, Any]:
        return {"skipped": list(self.skipped)}

    def restore_state(self, state_dict: Mapping[str, Any]) -> None:
        self.skipped = list(state_dict.get("skipped", []))


def _last_good(trainer: pl.Trainer) -> str:
    last = last_checkpoint_of(trainer)
    if last is None:
        return "none (no checkpoint folder)"
    if not last.is_file():
        return "none yet (rerunning starts over)"
    try:
        step = checkpoint_step(last)[0]
    except Exception:
        return str(last)
    return f"{last} (step {step}; rerun the same command to resume from it)"


def _agreed(
    trainer: pl.Trainer, bad: tuple[str, dict[str, Any]] | None
) -> tuple[str, dict[str, Any]] | None:
    """This rank's finding, or, when another rank found one, what that rank was: the same verdict
    on every rank (one all-reduce of ``world_size - rank`` for a rank that found one, 0 else; the
    maximum names the lowest such rank)."""
    world = trainer.world_size
    if world == 1:
        return bad
    import torch.distributed as dist

    local = torch.tensor(
        [world - trainer.global_rank if bad else 0], device=trainer.strategy.root_device
    )
    shared = int(trainer.strategy.reduce(local, reduce_op=dist.ReduceOp.MAX).item())
    if not shared or bad is not None:
        return bad
    rank = world - shared
    return f"a loss or gradient was not finite on rank {rank}", {"what": "rank", "rank": rank}


def _discard_step(trainer: pl.Trainer, optimizer: torch.optim.Optimizer) -> None:
    """Make the coming ``optimizer.step`` change nothing. Under 16-mixed with an optimizer that
    unscales in its own step (fused AdamW/Adam/SGD) the scaler checks the gradients only inside
    ``scaler.step``, after this hook: every gradient is filled with NaN, so it records ``found_inf``
    and skips as for an overflow. Elsewhere the gradients are set to None, which optimizers skip."""
    # the flag GradScaler.step and Lightning's _optimizer_handles_unscaling read (fused optimizers)
    scaler_checks_later = _has_grad_scaler(trainer) and getattr(
        optimizer, "_step_supports_amp_scaling", False
    )
    for group in optimizer.param_groups:
        for p in group["params"]:
            if scaler_checks_later:
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
            else:
                p.grad = None


def _first_nonfinite(t: torch.Tensor) -> str:
    """The first NaN/inf element of ``t`` as text ("nan", "inf", "-inf"): JSON has no NaN, and the
    sign of an infinity tells an overflow's direction."""
    t = t.detach()
    bad = t[~torch.isfinite(t)]
    return str(float(bad.flatten()[0])) if bad.numel() else "not finite"


def _not_finite(
    losses: list[torch.Tensor],
    pl_module: pl.LightningModule | None,
    optimizer: torch.optim.Optimizer | None,
) -> tuple[str, dict[str, Any]] | None:
    """What to say about the first loss, else the first gradient (in the optimizer's order), that
    is not finite, and the record of it. A check and the name lookup for each tensor cost a read
    from the device each: after :func:`_all_finite` failed only."""
    for loss in losses:
        if not bool(torch.isfinite(loss).all()):
            value = _first_nonfinite(loss)
            return f"loss is {value}", {"what": "loss", "value": value}
    names = {id(p): n for n, p in pl_module.named_parameters()} if pl_module is not None else {}
    for g, group in enumerate(optimizer.param_groups if optimizer is not None else []):
        for i, p in enumerate(group["params"]):
            if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
                name = names.get(id(p), f"param_groups[{g}] parameter {i}")
                value = _first_nonfinite(p.grad)
                record = {"what": "gradients", "parameter": name, "value": value}
                return f"the gradient of {name} is {value}", record
    return None


def _learning_rates(trainer: pl.Trainer) -> list[float]:
    """The learning rate of every parameter group of every optimizer, as this step uses it."""
    return [
        float(group["lr"])
        for optimizer in trainer.optimizers
        for group in optimizer.param_groups
        if "lr" in group
    ]


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element of ``tensors`` is finite: GradScaler's fused check (one call per
    device and dtype, as ``GradScaler._unscale_grads_`` groups them; the scale 1 leaves each value
    as it was), then one read from the device. On 2 CPU cores: 10 us for a small MLP where the
    loss check and the gradients' norms took 40, 3.4 ms for MiniLM's gradients where norms took
    4.6; and no false alarm where norms overflowed."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    found = {device: torch.zeros(1, device=device, dtype=torch.float32) for device, _ in groups}
    for (device, _), group in groups.items():
        one = torch.ones(1, device=device, dtype=torch.float32)  # the kernel's only dtype
        torch._amp_foreach_non_finite_check_and_unscale_(group, found[device], one)
    return not any(bool(flag) for flag in found.values())


def _has_grad_scaler(trainer: pl.Trainer) -> bool:
    """16-mixed: Lightning's MixedPrecision plugin keeps a GradScaler that skips overflowing steps."""
    return getattr(trainer.precision_plugin, "scaler", None) is not None
