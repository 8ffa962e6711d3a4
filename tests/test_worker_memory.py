"""Loader workers' memory: measured by starting one, cached, counted per loader kept alive."""

from __future__ import annotations

import pytest

from laptrain.hardware.probe import MemoryReading
from laptrain.preflight.batch import PreflightError, plan_batch
from laptrain.preflight.budget import GiB
from laptrain.preflight.worker_memory import (
    WorkerCost,
    measure_worker_bytes,
    worker_cost,
    worker_processes,
)
from tests.fakes import FakeProbe
from tests.test_preflight import SEQ, cpu_profile, tiny_bert


def test_persistent_workers_of_train_and_val_loaders_are_alive_together():
    assert worker_processes(4, persistent=True) == 8  # the m5 profile: 4 workers, persistent
    assert worker_processes(2, persistent=False) == 2
    assert worker_processes(0, persistent=True) == 0


def test_a_spawned_worker_costs_what_importing_torch_costs():
    """The macOS start method, measured here: a fresh interpreter that imports torch."""
    spawned = measure_worker_bytes("spawn")
    assert 100e6 < spawned < 2e9


def test_the_measurement_runs_once_per_machine_and_is_cached(tmp_path):
    calls: list[str] = []

    def fake_measure(method: str) -> float:
        calls.append(method)
        return 0.3 * GiB

    first = worker_cost(4, True, cache_dir=tmp_path, measure=fake_measure, start_method="spawn")
    again = worker_cost(4, True, cache_dir=tmp_path, measure=fake_measure, start_method="spawn")
    assert first == again == WorkerCost(8, 0.3 * GiB, "spawn")
    assert calls == ["spawn"]
    assert worker_cost(0, True, cache_dir=tmp_path, measure=fake_measure) is None
    assert calls == ["spawn"]


def test_workers_that_eat_the_budget_are_named_among_the_fixes():
    """m5-like profile: 8 persistent workers of 0.3 GiB take all of a 2.4 GiB budget."""
    probe = FakeProbe(
        kind="mps",
        readings=[
            MemoryReading(
                rss=0,
                system_total=16 * GiB,
                system_available=12 * GiB,
                system_percent=25.0,
                swap_used=0,
                device_limit=int(2.4 * GiB / 0.65) + 1000,
            )
        ],
    )
    workers = WorkerCost(8, 0.3 * GiB, "spawn")
    profile = cpu_profile(None, memory_fraction=0.65)
    plan_batch(tiny_bert(), SEQ, profile, probe)  # fits without the workers
    with pytest.raises(PreflightError, match=r"hardware\.num_workers=0"):
        plan_batch(tiny_bert(), SEQ, profile, probe, workers=workers)
