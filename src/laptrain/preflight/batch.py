"""Memory preflight: will this job fit, and what micro batch should it use?

Lightning's BatchSizeFinder and HF's ``auto_find_batch_size`` provoke OOM; on unified memory a
too-large batch swaps and the laptop crawls (docs/hardware.md §1, §7). So laptrain estimates
first (estimate.py) against the profile's budget (budget.py).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from laptrain.data.contracts import KnowsLengths
from laptrain.hardware.peak_rss import process_peak_bytes
from laptrain.hardware.probe import DeviceProbe, TorchProbe
from laptrain.preflight.activations import LossFn, MakeBatch, hf_batch_maker, hf_loss
from laptrain.preflight.budget import Budget, device_budget
from laptrain.preflight.estimate import Estimate, GiB, ModelMemory, model_memory
from laptrain.preflight.request import PlanRequest, kept_note
from laptrain.preflight.worker_memory import WorkerCost

if TYPE_CHECKING:
    from laptrain.hardware.run_device import RunDevice


class PreflightError(ValueError):
    """The job cannot fit; the message is one line with the estimate and the fixes, best first."""


@dataclass(frozen=True)
class BatchDecision:
    """The planner's answer, which the run plan holds: micro batch, accumulation, and the estimate
    behind them."""

    micro_batch: int
    accumulation: int
    devices: int
    seq_len: int
    precision: str
    device: str
    budget: Budget
    estimate: Estimate
    requested_batch: int | str
    effective_target: int | None
    checkpointing: bool
    measured_peak: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.accumulation * self.devices

    def summary_lines(self, batch: bool = True) -> list[str]:
        """What the preflight decided; without ``batch`` the batch line is left out (a run's
        summary prints micro batch, accumulation and effective batch itself, with reasons)."""
        lines = [
            f"preflight: estimate {self.estimate.line()}",
            f"preflight: budget {self.budget.bytes / GiB:.2f} GiB ({self.budget.source}) on {self.device}, "
            f"precision {self.precision}, gradient checkpointing {'on' if self.checkpointing else 'off'}",
        ]
        if batch:
            lines.append(
                f"preflight: micro batch {self.micro_batch} x accumulation {self.accumulation} x "
                f"devices {self.devices} = effective batch {self.effective_batch}"
                + (" (batch_size auto)" if self.requested_batch == "auto" else "")
            )
        if self.measured_peak is not None:
            ratio = self.estimate.total / self.measured_peak
            lines.append(
                f"preflight: verified with 2 real steps: peak {self.measured_peak / GiB:.2f} GiB, "
                f"estimate / measured = {ratio:.2f}"
            )
        return lines + [f"preflight: {note}" for note in self.notes]

    def to_json(self) -> str:
        data = asdict(self)
        data["estimate"]["total"] = self.estimate.total
        data["effective_batch"] = self.effective_batch
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str) -> BatchDecision:
        """The plan :meth:`to_json` wrote (``preflight.json``)."""
        data = json.loads(text)
        data.pop("effective_batch", None)
        estimate = {k: v for k, v in data.pop("estimate").items() if k != "total"}
        budget = data.pop("budget")
        return cls(**data, estimate=Estimate(**estimate), budget=Budget(**budget))


def _fix_options(job: _Job, est: Estimate) -> list[tuple[float, str]]:
    """Each change that could make micro batch 1 fit, with the bytes it would save."""
    memory, seq_len, kind = job.memory, est.seq_len, job.kind
    options: list[tuple[float, str]] = []
    for fraction in (2, 4):
        shorter = max(8, seq_len // fraction)
        saving = (
            est.total - memory.estimate(1, shorter, kind, job.baseline, job.optimizer_states).total
        )
        options.append((saving, f"shorter sequences (data.max_length={shorter})"))
    if memory.activations.blocks and not job.checkpointing:
        ckpt = memory.estimate(1, seq_len, kind, job.baseline, job.optimizer_states, True)
        where = (
            "model.gradient_checkpointing=true"
            if job.checkpointing_option
            else "activation_checkpointing_enable() on the transformers model"
        )
        options.append((est.total - ckpt.total, f"gradient checkpointing ({where})"))
    if job.precision == "32-true" and (kind == "cuda" or job.bf16):
        lower = "16-mixed" if kind == "cuda" else "bf16-mixed"
        saving = 0.5 * (est.activations + est.transient)
        options.append(
            (saving, f"lower precision (hardware.precision={lower}, about half the activations)")
        )
    if job.workers is not None and kind != "cuda":
        options.append((job.workers.total, "no loader workers (hardware.num_workers=0)"))
    static = est.weights + est.grads + est.optimizer
    options.append(
        (
            static / 2,
            "a smaller model (model=..., half the parameters halves weights/grads/optimizer)",
        )
    )
    return options


def _fixes(job: _Job, est: Estimate) -> list[str]:
    """Changes that would make micro batch 1 fit, largest saving first."""
    options = _fix_options(job, est)
    options.sort(key=lambda item: -item[0])
    need = est.total - job.budget.bytes
    fixes = [
        f"{text} saves {saving / GiB:.2f} GiB" + (" (enough)" if saving >= need else "")
        for saving, text in options
        if saving > 0
    ]
    if not any(saving >= need for saving, _ in options):
        fixes.append(
            f"none alone is enough (the process itself takes {est.overhead / GiB:.2f} GiB): "
            "raise the budget (hardware.memory_budget_gb, hardware.memory_fraction) or free memory"
        )
    return fixes


def measure_peak(
    model: nn.Module,
    micro_batch: int,
    seq_len: int,
    probe: DeviceProbe,
    precision: str,
    make_batch: MakeBatch,
    loss_fn: LossFn,
) -> float:
    """Run two real training steps and return their peak memory (bytes): AdamW at lr=0 allocates the
    real state and leaves the weights unchanged. CPU: peak RSS; CUDA: max allocated; MPS: driver
    memory after each step (no peak API, docs/hardware.md §7)."""
    from laptrain.preflight.activations import _autocast

    # the probe's own GPU (preflight.verify measured on the current one, GPU 0 for every rank)
    index = probe.index if probe.kind == "cuda" else None
    device = torch.device(probe.kind, index) if index is not None else torch.device(probe.kind)
    model.to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=0.0, weight_decay=0.0)
    probe.reset_peak()
    peak = 0.0
    with torch.random.fork_rng(devices=[]):
        for _ in range(2):
            with _autocast(device, precision):
                loss = loss_fn(model, make_batch(micro_batch, seq_len))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            probe.synchronize()
            reading = probe.memory()
            peak = max(peak, float(reading.device_peak or reading.device_reserved or 0))
    del optimizer, loss
    gc.collect()
    probe.empty_cache()
    return peak if probe.kind != "cpu" else process_peak_bytes()


@dataclass(frozen=True)
class _Job:
    """The job measured on this device: the estimate of any micro batch and the budget to fit."""

    memory: ModelMemory
    seq_len: int
    kind: str
    baseline: float
    optimizer_states: int
    shards: int
    checkpointing: bool
    budget: Budget
    make_batch: MakeBatch
    loss_fn: LossFn
    # what a refusal's fixes need besides the estimate
    precision: str = "32-true"
    bf16: bool = False
    checkpointing_option: bool = False
    workers: WorkerCost | None = None
    notes: tuple[str, ...] = ()

    def estimate(self, batch: int, checkpointed: bool | None = None) -> Estimate:
        """The peak of micro batch ``batch``, checkpointing as decided unless ``checkpointed``."""
        ckpt = self.checkpointing if checkpointed is None else checkpointed
        return self.memory.estimate(
            batch, self.seq_len, self.kind, self.baseline, self.optimizer_states, ckpt, self.shards
        )


def _measure(
    model: nn.Module,
    seq_len: int,
    probe: DeviceProbe,
    request: PlanRequest,
    precision: str,
    checkpointing: bool | None,
    optimizer_states: int,
    workers: WorkerCost | None,
    make_batch: MakeBatch | None,
    loss_fn: LossFn | None,
) -> _Job:
    """The budget, the model's memory measured on this device, and whether checkpointing is on."""
    kind = probe.kind
    budget = device_budget(probe, request.memory_fraction, request.memory_budget_gb, workers)
    make_batch = make_batch or hf_batch_maker(model)
    loss_fn = loss_fn or hf_loss
    reading = probe.memory()  # before the measuring passes, whose blocks the allocator may keep
    memory = model_memory(model, seq_len, precision, make_batch, loss_fn)
    if request.auto_checkpointing:
        on = False
    else:
        on = memory.activations.checkpointing if checkpointing is None else checkpointing
    baseline = (
        max(0.0, float(reading.rss) - memory.materialized_cpu_bytes) if kind == "cpu" else 0.0
    )
    job = _Job(
        memory,
        seq_len,
        kind,
        baseline,
        optimizer_states,
        request.shards,
        on,
        budget,
        make_batch,
        loss_fn,
        precision,
        probe.bf16_supported(),
        "gradient_checkpointing" in (getattr(model, "hparams", None) or {}),
        workers,
    )
    if request.auto_checkpointing and memory.activations.blocks:
        job = _settle_checkpointing(job, 1 if request.auto else request.size)
    return job


def _settle_checkpointing(job: _Job, micro: int) -> _Job:
    """``checkpointing: auto``: on only when the asked batch does not fit without it (with a note)."""
    needed = job.estimate(micro, False)
    budget = job.budget
    on = needed.total > budget.bytes
    note = (
        f"gradient checkpointing on (model.gradient_checkpointing=auto: without it micro batch "
        f"{needed.micro_batch} needs {needed.total / GiB:.2f} GiB > budget {budget.bytes / GiB:.2f} GiB)"
        if on
        else "gradient checkpointing off (model.gradient_checkpointing=auto: the job fits "
        "without it)"
    )
    return replace(job, checkpointing=on, notes=(*job.notes, note))


def _largest_fit(job: _Job, max_batch: int) -> int:
    """The largest micro batch the budget holds; refuses the job when not even 1 fits."""
    one = job.estimate(1)
    budget = job.budget
    if one.total > budget.bytes:
        fixes = "; ".join(_fixes(job, one))
        raise PreflightError(
            f"this job does not fit even at micro batch 1: estimate {one.total / GiB:.2f} GiB > budget "
            f"{budget.bytes / GiB:.2f} GiB ({budget.source}). Fixes, largest first: {fixes}"
        )
    per_sample = job.estimate(2).total - one.total
    return 1 + int((budget.bytes - one.total) // per_sample) if per_sample > 0 else max_batch


def _fixed_batch(
    job: _Job, request: PlanRequest, largest_fit: int, notes: list[str]
) -> tuple[int, int]:
    """A fixed batch: refused when it does not fit; accumulation keeps the effective batch."""
    micro = request.size
    budget = job.budget
    if micro > largest_fit:
        raise PreflightError(
            f"hardware.batch_size={micro} does not fit: estimate {job.estimate(micro).total / GiB:.2f} GiB > "
            f"budget {budget.bytes / GiB:.2f} GiB ({budget.source}); the largest that fits is "
            f"{largest_fit}: set hardware.batch_size=auto (or <= {largest_fit})"
        )
    accum = request.fixed_accumulation(micro)
    effective_batch, devices = request.effective_batch, request.devices
    if effective_batch and micro * accum * devices != effective_batch:
        notes.append(
            f"effective batch {micro * accum * devices} instead of {effective_batch} "
            f"(micro batch {micro} does not divide it; batch_size=auto would)"
        )
    return micro, accum


def decision(
    request: PlanRequest, precision: str, micro_accumulation: tuple[int, int], **found: Any
) -> BatchDecision:
    """The plan of ``request`` at (micro batch, accumulation), with what the sizer ``found``
    (device, budget, estimate, seq_len, checkpointing, notes)."""
    micro, accumulation = micro_accumulation
    return BatchDecision(
        micro_batch=micro,
        accumulation=accumulation,
        devices=request.devices,
        precision=precision,
        requested_batch=request.requested,
        effective_target=request.effective_batch,
        **found,
    )


def _choose(job: _Job, request: PlanRequest) -> BatchDecision:
    """The plan at the micro batch chosen (auto) or checked (fixed) against the budget."""
    largest_fit = _largest_fit(job, request.max_batch)
    notes = list(job.notes)
    previous = request.previous
    if request.auto and previous and previous[0] <= largest_fit:
        notes.append(kept_note(previous))
        batch = previous
    elif request.auto:
        batch = request.auto_batch(largest_fit)
    else:
        batch = _fixed_batch(job, request, largest_fit, notes)
    return decision(
        request,
        job.precision,
        batch,
        estimate=job.estimate(batch[0]),
        seq_len=job.seq_len,
        device=job.kind,
        budget=job.budget,
        checkpointing=job.checkpointing,
        notes=notes,
    )


def _verify(
    plan: BatchDecision, model: nn.Module, probe: DeviceProbe, job: _Job, request: PlanRequest
) -> BatchDecision:
    """Two real steps at the planned batch: their peak goes into the plan, which it corrects."""
    peak = measure_peak(
        model, plan.micro_batch, job.seq_len, probe, job.precision, job.make_batch, job.loss_fn
    )
    return _correct(replace(plan, measured_peak=peak), job.estimate, job.budget, request)


def _correct(
    plan: BatchDecision, estimate: Callable[[int], Estimate], budget: Budget, request: PlanRequest
) -> BatchDecision:
    """After ``verify``: when the real peak exceeds the estimate, scale the estimate by that
    ratio and (``auto``) lower the micro batch until the corrected estimate fits."""
    ratio = (plan.measured_peak or 0.0) / plan.estimate.total
    if ratio <= 1.0 or ratio * plan.estimate.total <= budget.bytes:
        return plan
    if not request.auto:
        plan.notes.append(
            f"measured peak is {ratio:.2f} x the estimate and above the budget: "
            "lower hardware.batch_size (or set it to auto)"
        )
        return plan
    fit = plan.micro_batch
    while fit > 0 and ratio * estimate(fit).total > budget.bytes:
        fit -= 1
    if fit == 0:
        raise PreflightError(
            f"measured peak {plan.measured_peak / GiB:.2f} GiB at micro batch {plan.micro_batch} is "
            f"{ratio:.2f} x the estimate; even micro batch 1 would exceed the budget "
            f"{budget.bytes / GiB:.2f} GiB ({budget.source}): shorten data.max_length or raise the budget"
        )
    micro, accumulation = request.auto_batch(fit)
    if request.effective_batch is None:
        accumulation = plan.accumulation
    plan.notes.append(
        f"measured peak is {ratio:.2f} x the estimate: micro batch lowered {plan.micro_batch} -> "
        f"{micro} (accumulation {accumulation})"
    )
    return replace(plan, micro_batch=micro, accumulation=accumulation, estimate=estimate(micro))


def training_length(datamodule: Any) -> tuple[int | None, str | None]:
    """(tokens per row the preflight sizes by, a note when that is not ``max_length``): batches
    padded per batch are no wider than the longest example."""
    limit = getattr(datamodule, "max_length", None) or getattr(datamodule, "seq_len", None)
    if not isinstance(datamodule, KnowsLengths):
        return limit, None
    longest = datamodule.longest_example("train")
    if not longest or (limit and longest >= limit):
        return limit, None
    return longest, (
        f"sized by the longest training example, {longest} tokens (data.max_length {limit})"
    )


def plan_batch(
    model: nn.Module,
    seq_len: int,
    request: PlanRequest,
    probe: DeviceProbe,
    precision: str = "32-true",
    checkpointing: bool | None = None,
    optimizer_states: int = 2,
    make_batch: MakeBatch | None = None,
    loss_fn: LossFn | None = None,
    workers: WorkerCost | None = None,
) -> BatchDecision:
    """Plan the micro batch of a job before the Trainer is built.

    ``request.auto`` picks the largest micro batch that fits (an earlier session's while it fits),
    else ``size`` is checked; ``auto_checkpointing`` turns checkpointing on only when needed.
    Raises :class:`PreflightError` when the job does not fit at micro batch 1 (or the fixed
    batch)."""
    job = _measure(
        model,
        seq_len,
        probe,
        request,
        precision,
        checkpointing,
        optimizer_states,
        workers,
        make_batch,
        loss_fn,
    )
    plan = _choose(job, request)
    return _verify(plan, model, probe, job, request) if request.verify else plan


def estimate_plan(
    model: nn.Module,
    datamodule: Any,
    request: PlanRequest,
    device: RunDevice,
    workers: WorkerCost | None,
) -> BatchDecision:
    """``plan_batch`` for a built datamodule and model (the sizer of
    ``laptrain.preflight.planner.estimated``): sized by the longest tokenized training example
    (``KnowsLengths``), else ``max_length``, on this rank's own GPU (``device.index``)."""
    from laptrain.model.contracts import SizesItsStep

    probe = TorchProbe(device.kind, device.index)
    seq_len, length_note = training_length(datamodule)
    own_step: dict[str, Any] = {}
    if isinstance(model, SizesItsStep):
        own_step["make_batch"] = model.preflight_batch
        own_step["loss_fn"] = lambda module, batch: module.preflight_loss(batch)
    plan = plan_batch(
        model, int(seq_len), request, probe, device.precision, workers=workers, **own_step
    )
    if length_note:
        plan.notes.insert(0, length_note)
    return plan
