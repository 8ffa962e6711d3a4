"""What a run asks of its batch planner (:class:`PlanRequest`), parsed once by the run plan, and the
batch arithmetic both planners share."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from laptrain.data.contracts import Loader


@dataclass(frozen=True)
class PlannedRun:
    """The run as its Trainer will have it (length, accumulation, devices, nodes, and whether the
    strategy shards the model state: FSDP; else, with several ranks, DDP)."""

    max_epochs: int | None = None
    max_steps: int = -1
    accumulation: int = 1
    devices: int = 1
    nodes: int = 1
    sharded: bool = False

    @property
    def ranks(self) -> int:
        return self.devices * self.nodes

    @property
    def epochs(self) -> int:
        """``max_epochs`` as Lightning parses it (lightning/pytorch/loops/utilities.py:71-80)."""
        if self.max_epochs is not None:
            return self.max_epochs
        return 1000 if self.max_steps == -1 else -1

    def stepping_batches(self, loader_batches: float) -> float:
        """Lightning's ``Trainer.estimated_stepping_batches`` for ``loader_batches`` batches an
        epoch (lightning/pytorch/trainer/trainer.py:1768-1786), each rank its sampler's share."""
        if self.epochs == -1:
            return math.inf if self.max_steps == -1 else self.max_steps
        if loader_batches == math.inf:
            return self.max_steps
        per_rank = math.ceil(loader_batches / self.ranks)
        steps = math.ceil(per_rank / self.accumulation) * max(self.epochs, 1)
        return min(steps, self.max_steps) if self.max_steps != -1 else steps


@dataclass(frozen=True)
class PlanRequest:
    """What a run asks of its planner, parsed once from the config (job/plan.py): ``auto`` picks
    the largest batch that fits, else ``size`` is checked (``option`` names its setting); the
    effective batch or accumulation to keep; the budget's settings (``memory_*``); whether
    ``model.gradient_checkpointing`` is auto; the loader's workers; the run's shape."""

    auto: bool = True
    size: int = 1
    accumulation: int = 1
    effective_batch: int | None = None
    max_batch: int = 256
    multiple: int = 1
    memory_fraction: float = 0.8
    memory_budget_gb: float | None = None
    auto_checkpointing: bool = False
    verify: bool = False
    option: str = "hardware.batch_size"
    loader: Loader = Loader(0, False, False)
    run: PlannedRun = field(default_factory=PlannedRun)
    previous: tuple[int, int] | None = None  # an earlier session's (micro batch, accumulation)

    @property
    def requested(self) -> int | str:
        return "auto" if self.auto else self.size

    @property
    def devices(self) -> int:
        return self.run.devices

    @property
    def shards(self) -> int:
        """Over how many ranks the model state is split (FSDP), else 1."""
        return self.run.ranks if self.run.sharded else 1

    def fixed_accumulation(self, micro: int) -> int:
        """The accumulation of a fixed micro batch: the one that keeps ``effective_batch``."""
        if not self.effective_batch:
            return self.accumulation
        return max(1, math.ceil(self.effective_batch / (micro * self.devices)))

    def auto_batch(self, largest_fit: int) -> tuple[int, int]:
        """(micro batch, accumulation) for ``auto`` when ``largest_fit`` is the largest that
        fits: with a target effective batch it divides it, else accumulation stays as asked."""
        micro, accumulation = choose_micro_batch(
            min(largest_fit, self.max_batch), self.effective_batch, self.multiple
        )
        return micro, accumulation if self.effective_batch is not None else self.accumulation


def kept_note(previous: tuple[int, int]) -> str:
    return (
        f"kept micro batch {previous[0]} x accumulation {previous[1]} of this run's earlier session"
    )


def _aligned(value: int, multiple: int) -> int:
    return value - value % multiple if multiple > 1 and value >= multiple else value


def choose_micro_batch(largest_fit: int, effective: int | None, multiple: int) -> tuple[int, int]:
    """(micro batch, accumulation) for the largest micro batch that fits: with a target effective
    batch the micro batch divides it exactly (aligned when possible), else accumulation stays 1."""
    if effective is None:
        return _aligned(largest_fit, multiple), 1
    top = min(largest_fit, effective)
    divisors = [m for m in range(top, 0, -1) if effective % m == 0]
    aligned = [m for m in divisors if multiple > 1 and m % multiple == 0]
    micro = (aligned or divisors)[0]
    return micro, effective // micro
