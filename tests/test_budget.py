"""The budget rule: under MPS's LOW watermark, less the loader workers' host memory."""

from __future__ import annotations

import pytest

from laptrain.hardware.probe import MemoryReading
from laptrain.hardware.profile import load_profile
from laptrain.preflight.budget import GiB, device_budget, mps_low_watermark
from laptrain.preflight.worker_memory import WorkerCost
from tests.fakes import FakeProbe


def reading(**kw) -> MemoryReading:
    base = dict(
        rss=1 * GiB,
        system_total=16 * GiB,
        system_available=12 * GiB,
        system_percent=25.0,
        swap_used=0,
    )
    return MemoryReading(**{**base, **kw})


def mps(limit_gb: float = 12.0) -> FakeProbe:
    return FakeProbe(kind="mps", readings=[reading(device_limit=int(limit_gb * GiB))])


def test_the_mps_budget_never_reaches_the_low_watermark():
    """A fraction above LOW would keep the job in the allocator's garbage-collecting band."""
    env = {"PYTORCH_MPS_LOW_WATERMARK_RATIO": "0.7", "PYTORCH_MPS_HIGH_WATERMARK_RATIO": "0.8"}
    budget = device_budget(mps(), 0.8, environ=env)
    assert budget.bytes == pytest.approx(0.7 * 12 * GiB)
    assert "LOW watermark 0.7" in budget.source
    below = device_budget(mps(), 0.65, environ=env)
    assert below.bytes == pytest.approx(0.65 * 12 * GiB) and "LOW" not in below.source


def test_every_apple_profile_plans_under_its_own_low_watermark():
    for name in ("mps", "m1_mini", "m2_air", "m3_pro", "m4_max", "m5", "m5_max"):
        profile = load_profile(name)
        low = float(profile["env"]["PYTORCH_MPS_LOW_WATERMARK_RATIO"])
        high = float(profile["env"]["PYTORCH_MPS_HIGH_WATERMARK_RATIO"])
        assert profile["memory_fraction"] < low <= high, name


def test_low_watermark_defaults_to_the_allocators_unified_memory_default():
    assert mps_low_watermark({}) == 1.4
    assert mps_low_watermark({"PYTORCH_MPS_LOW_WATERMARK_RATIO": "0.5"}) == 0.5


def test_workers_come_out_of_host_and_unified_memory_but_not_a_gpus():
    workers = WorkerCost(processes=8, bytes_each=0.3 * GiB, start_method="spawn")
    plain = device_budget(mps(), 0.65, environ={})
    less = device_budget(mps(), 0.65, workers=workers, environ={})
    assert plain.bytes - less.bytes == pytest.approx(2.4 * GiB)
    assert "8 loader worker(s) x 0.30 GiB (spawn, measured)" in less.source
    cpu = FakeProbe(kind="cpu", readings=[reading()])
    assert device_budget(cpu, 0.8, workers=workers).bytes == pytest.approx(
        0.8 * 12 * GiB + 1 * GiB - 2.4 * GiB
    )
    gpu = FakeProbe(kind="cuda", readings=[reading(device_free=20 * GiB, device_limit=24 * GiB)])
    assert device_budget(gpu, 0.9, workers=workers).bytes == pytest.approx(18 * GiB)
