"""The batch planner of a run: one interface (:class:`BatchPlanner`), two implementations chosen
once (:func:`choose_planner`). :func:`estimated` sizes a transformers model from its shapes
(batch.py), :func:`measured` trains a copy of any module (measured.py); both are :func:`plan`,
which keeps rank 0's plan, a resumed session's batch and ``preflight.json``, around the one thing
they differ in: how big one batch's peak is (a :class:`Sizer`)."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from laptrain.files import write_text_atomic
from laptrain.preflight.batch import BatchDecision, estimate_plan, training_length
from laptrain.preflight.measured import measured_plan
from laptrain.preflight.request import PlanRequest
from laptrain.preflight.worker_memory import WorkerCost, worker_cost
from laptrain.ranks.environment import extra_rank

if TYPE_CHECKING:
    from laptrain.hardware.run_device import RunDevice


class Sizer(Protocol):
    """How big one batch's peak is, as a plan for ``request`` on ``device``: batch.estimate_plan,
    measured.measured_plan."""

    def __call__(
        self,
        model: Any,
        datamodule: Any,
        request: PlanRequest,
        device: RunDevice,
        workers: WorkerCost | None,
    ) -> BatchDecision: ...


class BatchPlanner(Protocol):
    """:func:`estimated`, :func:`measured`, or a stand-in in tests."""

    def __call__(
        self,
        model: Any,
        datamodule: Any,
        request: PlanRequest,
        device: RunDevice,
        output_dir: Path | None = None,
        cache_dir: Path | None = None,
    ) -> BatchDecision: ...


def plan(
    size: Sizer,
    model: Any,
    datamodule: Any,
    request: PlanRequest,
    device: RunDevice,
    output_dir: Path | None = None,
    cache_dir: Path | None = None,
) -> BatchDecision:
    """The plan ``size`` makes, written to ``output_dir/preflight.json``: on a rank other than 0 the
    one rank 0 wrote; ``auto`` keeps an earlier session's batch while it fits."""
    record = output_dir / "preflight.json" if output_dir is not None else None
    if record is not None and record.is_file() and extra_rank():
        # Ranks that Lightning's subprocess launcher starts would measure their GPU while rank 0's
        # model already fills memory: they take rank 0's plan, written just before it launched
        # them. (torchrun and srun start every rank at once, before any file is written: there
        # rank 0's plan is broadcast instead, laptrain.preflight.shared_plan.)
        shared = BatchDecision.from_json(record.read_text())
        shared.notes.append("the plan of rank 0 (preflight.json), not measured on this rank")
        return shared
    if request.auto and record is not None and record.is_file():
        earlier = json.loads(record.read_text())
        previous = (int(earlier["micro_batch"]), int(earlier["accumulation"]))
        request = replace(request, previous=previous)
    loader = request.loader
    workers = worker_cost(loader.num_workers, loader.persistent_workers, cache_dir=cache_dir)
    planned = size(model, datamodule, request, device, workers)
    if record is not None:
        record.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(record, planned.to_json())
    return planned


# the estimate from the model's shapes; the measurement of a copy of the module
estimated: BatchPlanner = partial(plan, estimate_plan)
measured: BatchPlanner = partial(plan, measured_plan)


def choose_planner(model: Any, datamodule: Any) -> BatchPlanner:
    """The estimate for a transformers model with a sequence length, else the measurement."""
    from torch import nn

    from laptrain.preflight.activations import find_hf_model

    hf_model = find_hf_model(model) if isinstance(model, nn.Module) else None
    return estimated if hf_model is not None and training_length(datamodule)[0] else measured
