"""MemoryMonitor: MPS/CUDA/CPU scalars, cleanup policy, swap alarm and stop, leak warning."""

from __future__ import annotations

from unittest.mock import Mock

import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from laptrain.callbacks.memory_monitor import MemoryMonitor
from laptrain.callbacks.memory_trend import GrowthTrend, SwapWatch
from laptrain.hardware.power import ProcessMemory
from laptrain.hardware.probe import MemoryReading
from tests.conftest import quiet_trainer
from tests.fake_ranks import two_ranks
from tests.fakes import FakePressure, FakeProbe

MB = 1024 * 1024
TOP = [ProcessMemory("Safari", 501, 3 * 1024 * MB), ProcessMemory("Slack", 502, 1024 * MB)]


@pytest.fixture(autouse=True)
def _no_os_pressure(monkeypatch):
    """The same figures on a Mac as on Linux: the OS pressure level only where a test scripts it."""
    monkeypatch.setattr("laptrain.callbacks.memory_monitor.pressure_source", lambda: None)


def reading(rss=100, percent=50.0, swap=0, alloc=None, reserved=None, peak=None, limit=None):
    return MemoryReading(
        rss=rss * MB,
        system_total=16 * 1024 * MB,
        system_available=8 * 1024 * MB,
        system_percent=percent,
        swap_used=swap * MB,
        device_allocated=None if alloc is None else alloc * MB,
        device_reserved=None if reserved is None else reserved * MB,
        device_peak=None if peak is None else peak * MB,
        device_limit=None if limit is None else limit * MB,
    )


def fit(
    monitor: MemoryMonitor, steps: int, tmp_path, epochs: int = 1000, batches: int | None = None
):
    logger = Mock()
    logger.save_dir = str(tmp_path)
    trainer = quiet_trainer(
        last_ckpt=tmp_path / "last.ckpt",
        accelerator="cpu",
        max_steps=steps,
        max_epochs=epochs,
        limit_train_batches=batches,
        limit_val_batches=0,
        logger=logger,
        callbacks=[monitor],
        default_root_dir=tmp_path,
    )
    trainer.fit(BoringModel())
    return trainer, logger


def memory_calls(logger: Mock) -> list[tuple[int, dict]]:
    calls = [
        (c.kwargs.get("step"), c.args[0] if c.args else c.kwargs["metrics"])
        for c in logger.log_metrics.call_args_list
    ]
    return [(s, m) for s, m in calls if any(k.startswith("memory/") for k in m)]


def test_mps_branch_logs_allocator_figures_and_share_of_recommended(tmp_path):
    probe = FakeProbe(kind="mps", readings=[reading(alloc=300, reserved=512, limit=1024)])
    monitor = MemoryMonitor(every_n_steps=2, cleanup_on_epoch_end=False, probe=probe)
    _, logger = fit(monitor, 4, tmp_path)
    expected = {
        "memory/rss_mb": 100.0,
        "memory/system_percent": 50.0,
        "memory/swap_used_mb": 0.0,
        "memory/mps_allocated_mb": 300.0,
        "memory/mps_driver_mb": 512.0,
        "memory/mps_recommended_pct": 50.0,
    }
    assert memory_calls(logger) == [(2, expected), (4, expected)]
    assert "empty_cache" not in probe.calls  # logging never throws the allocator cache away


def test_cuda_branch_logs_allocated_reserved_and_peak(tmp_path):
    probe = FakeProbe(
        kind="cuda", readings=[reading(alloc=200, reserved=256, peak=250, limit=8192)]
    )
    monitor = MemoryMonitor(every_n_steps=3, cleanup_on_epoch_end=False, probe=probe)
    _, logger = fit(monitor, 3, tmp_path)
    assert memory_calls(logger) == [
        (
            3,
            {
                "memory/rss_mb": 100.0,
                "memory/system_percent": 50.0,
                "memory/swap_used_mb": 0.0,
                "memory/cuda_allocated_mb": 200.0,
                "memory/cuda_reserved_mb": 256.0,
                "memory/cuda_peak_mb": 250.0,
            },
        )
    ]
    assert monitor.summary()["peak_device_peak_mb"] == 250.0


def test_cpu_branch_logs_host_figures_only(tmp_path):
    probe = FakeProbe(kind="cpu", readings=[reading(rss=64, percent=40.0, swap=8)])
    monitor = MemoryMonitor(every_n_steps=1, cleanup_on_epoch_end=False, probe=probe)
    _, logger = fit(monitor, 1, tmp_path)
    assert memory_calls(logger) == [
        (1, {"memory/rss_mb": 64.0, "memory/system_percent": 40.0, "memory/swap_used_mb": 8.0})
    ]


def test_cleanup_at_epoch_end_logs_what_it_freed(tmp_path):
    before, after = reading(alloc=300, reserved=900), reading(alloc=300, reserved=400)
    probe = FakeProbe(kind="mps", readings=[before, after])
    monitor = MemoryMonitor(every_n_steps=100, probe=probe)
    _, logger = fit(monitor, -1, tmp_path, epochs=1, batches=4)
    assert memory_calls(logger) == [(4, {"memory/cleanup_freed_mb": 500.0})]
    assert probe.calls == ["memory", "empty_cache", "memory"]
    assert monitor.cleanups == 1 and monitor.freed_mb == 500.0


def test_pressure_cleanup_respects_threshold_and_cooldown(tmp_path, caplog):
    high = reading(percent=91.0, alloc=10, reserved=600)
    probe = FakeProbe(kind="mps", readings=[high])
    monitor = MemoryMonitor(
        every_n_steps=1,
        cleanup_on_epoch_end=False,
        cleanup_above_percent=90.0,
        cleanup_cooldown_steps=3,
        probe=probe,
    )
    _, logger = fit(monitor, 7, tmp_path)
    cleaned_at = [s for s, m in memory_calls(logger) if "memory/cleanup_freed_mb" in m]
    assert cleaned_at == [1, 4, 7]
    assert probe.calls.count("empty_cache") == 3


def test_swap_growth_warns_once_naming_the_knobs(tmp_path):
    probe = FakeProbe(
        readings=[reading(swap=100), reading(swap=200), reading(swap=400), reading(swap=900)]
    )
    monitor = MemoryMonitor(
        every_n_steps=1, cleanup_on_epoch_end=False, swap_growth_mb=256, probe=probe
    )
    with pytest.warns(UserWarning, match="swap grew by 300 MB") as record:
        trainer, _ = fit(monitor, 4, tmp_path)
    swap_warnings = [w for w in record if "swap" in str(w.message)]
    assert len(swap_warnings) == 1
    assert "hardware.batch_size" in str(swap_warnings[0].message)
    assert "PYTORCH_MPS_HIGH_WATERMARK_RATIO" in str(swap_warnings[0].message)
    assert trainer.global_step == 4 and monitor.stop_reason is None
    assert monitor.summary()["swap_grew_mb"] == 800.0


def test_swap_stop_ends_the_run_at_that_step(tmp_path):
    probe = FakeProbe(readings=[reading(swap=0), reading(swap=0), reading(swap=512)])
    monitor = MemoryMonitor(
        every_n_steps=1,
        cleanup_on_epoch_end=False,
        on_swap="stop",
        swap_growth_mb=256,
        probe=probe,
    )
    with pytest.warns(UserWarning, match="stopping with a checkpoint"):
        trainer, _ = fit(monitor, 20, tmp_path)
    assert trainer.global_step == 3 and monitor.stop_reason == "swap"
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 3


def test_growth_trend_reports_steady_growth_only():
    steady = GrowthTrend(window_steps=10, min_mb_per_100_steps=50)
    rates = [steady.update(step, (1000 + 2 * step) * MB) for step in range(0, 11)]
    assert rates[:-1] == [None] * 10 and rates[-1] == pytest.approx(200.0)

    jump = GrowthTrend(window_steps=10, min_mb_per_100_steps=50)
    rates = [jump.update(step, (1000 + (500 if step > 5 else 0)) * MB) for step in range(0, 11)]
    assert rates == [None] * 11  # one jump is the cache growing, not a leak


def test_leak_warning_in_a_run(tmp_path):
    readings = [reading(rss=100 + 10 * i) for i in range(12)]
    probe = FakeProbe(readings=readings)
    monitor = MemoryMonitor(
        every_n_steps=1,
        cleanup_on_epoch_end=False,
        leak_window_steps=5,
        leak_mb_per_100_steps=100,
        probe=probe,
    )
    with pytest.warns(UserWarning, match="grew steadily by 1000 MB per 100 steps"):
        fit(monitor, 8, tmp_path)
    assert monitor.leak_mb_per_100_steps == pytest.approx(1000.0)


def test_swap_watch_threshold():
    watch = SwapWatch(threshold_mb=100)
    assert watch.update(50 * MB) is None and watch.update(149 * MB) is None
    assert watch.update(150 * MB) == 100.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"every_n_steps": 0}, "memory_monitor.every_n_steps"),
        ({"cleanup_above_percent": 120.0}, "memory_monitor.cleanup_above_percent"),
        ({"on_swap": "panic"}, "memory_monitor.on_swap"),
        ({"on_pressure": "panic"}, "memory_monitor.on_pressure"),
        ({"swap_growth_mb": 0}, "memory_monitor.swap_growth_mb"),
        ({"leak_window_steps": 1}, "memory_monitor.leak_window_steps"),
    ],
)
def test_bad_values_name_their_config_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MemoryMonitor(**kwargs)


def test_peaks_and_cleanups_survive_a_checkpoint(tmp_path):
    probe = FakeProbe(
        kind="mps",
        readings=[reading(rss=100, alloc=10, reserved=20), reading(rss=300, alloc=30, reserved=40)],
    )
    monitor = MemoryMonitor(every_n_steps=1, cleanup_on_epoch_end=False, probe=probe)
    fit(monitor, 2, tmp_path)
    restored = MemoryMonitor()
    restored.load_state_dict(monitor.state_dict())
    assert (
        restored.peaks
        == monitor.peaks
        == {
            "rss_mb": 300.0,
            "system_percent": 50.0,
            "device_allocated_mb": 30.0,
            "device_reserved_mb": 40.0,
            "swap_used_mb": 0.0,
            "swap_grew_mb": 0.0,
        }
    )
    assert monitor.state_dict()["version"] == 1


def pressure_monitor(levels, tmp_path, **kwargs) -> MemoryMonitor:
    return MemoryMonitor(
        every_n_steps=1,
        cleanup_on_epoch_end=False,
        probe=FakeProbe(kind="mps", readings=[reading()]),
        pressure=FakePressure(levels),
        top_consumers=lambda: TOP,
        **kwargs,
    )


def test_macos_pressure_warning_names_the_top_consumers_once(tmp_path):
    monitor = pressure_monitor([1, 2, 2, 1, 2], tmp_path)
    with pytest.warns(UserWarning, match="memory pressure is warning") as record:
        trainer, logger = fit(monitor, 5, tmp_path)
    named = [str(w.message) for w in record if "memory pressure" in str(w.message)]
    assert len(named) == 1 and "yellow in Activity Monitor" in named[0]
    assert "Safari (pid 501) 3.0 GiB; Slack (pid 502) 1.0 GiB" in named[0]
    levels = [m["memory/pressure_level"] for _, m in memory_calls(logger)]
    assert levels == [1.0, 2.0, 2.0, 1.0, 2.0]
    assert trainer.global_step == 5 and monitor.stop_reason is None
    assert monitor.summary()["worst_pressure"] == "warning"


def test_macos_pressure_critical_warns_or_stops_like_on_swap(tmp_path):
    warn = pressure_monitor([1, 4], tmp_path / "warn")
    with pytest.warns(UserWarning, match=r"critical \(red in Activity Monitor\), continuing"):
        trainer, _ = fit(warn, 4, tmp_path / "warn")
    assert trainer.global_step == 4 and warn.stop_reason is None

    stop = pressure_monitor([1, 1, 4], tmp_path, on_pressure="stop")
    with pytest.warns(
        UserWarning, match=r"stopping with a checkpoint \(memory_monitor.on_pressure"
    ):
        trainer, _ = fit(stop, 20, tmp_path)
    assert trainer.global_step == 3 and stop.stop_reason == "memory pressure"
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 3
    assert stop.summary()["worst_pressure"] == "critical"


def test_no_pressure_source_off_macos_and_nothing_in_the_summary(tmp_path):
    monitor = MemoryMonitor(every_n_steps=1, cleanup_on_epoch_end=False, probe=FakeProbe())
    _, logger = fit(monitor, 2, tmp_path)
    assert monitor.pressure is None
    assert all("memory/pressure_level" not in m for _, m in memory_calls(logger))
    assert "worst_pressure" not in monitor.summary()


@pytest.mark.parametrize("swapping_rank", [0, 1])
def test_swap_alarm_on_one_rank_makes_the_same_collectives_on_both(swapping_rank, tmp_path):
    """Swap growth seen by one rank only: both ranks broadcast at every check point and follow
    rank 0 (both stop at step 3 with a save, or neither stops); no rank waits alone."""
    quiet, swapping = [reading(swap=0)], [reading(swap=0), reading(swap=0), reading(swap=512)]

    def make(rank: int) -> MemoryMonitor:
        return MemoryMonitor(
            every_n_steps=1,
            cleanup_on_epoch_end=False,
            on_swap="stop",
            swap_growth_mb=256,
            probe=FakeProbe(readings=swapping if rank == swapping_rank else quiet),
            use_os_pressure=False,
        )

    trainers, monitors = two_ranks(make, batches=6)
    assert trainers[0].strategy.calls == trainers[1].strategy.calls
    if swapping_rank == 0:
        assert trainers[0].strategy.calls == [
            (1, "broadcast"),
            (2, "broadcast"),
            (3, "broadcast"),
            (3, "barrier"),
        ]
        assert [t.global_step for t in trainers] == [3, 3]
        assert [m.stop_reason for m in monitors] == ["swap", "swap"]
    else:
        assert trainers[0].strategy.calls == [(s, "broadcast") for s in range(1, 7)]
        assert [t.global_step for t in trainers] == [6, 6]
        assert [m.stop_reason for m in monitors] == [None, None]


def test_pressure_unread_on_rank_0_and_critical_on_rank_1_keeps_the_ranks_together(tmp_path):
    """Rank 0 cannot read the pressure level (None) while rank 1 reads critical: the same
    broadcasts on both, and rank 0's reading (none) decides: nobody stops."""

    def make(rank: int) -> MemoryMonitor:
        return MemoryMonitor(
            every_n_steps=2,
            cleanup_on_epoch_end=False,
            on_pressure="stop",
            probe=FakeProbe(readings=[reading()]),
            pressure=FakePressure([None] if rank == 0 else [1, 4]),
            top_consumers=lambda: TOP,
        )

    trainers, monitors = two_ranks(make, batches=6)
    assert trainers[0].strategy.calls == trainers[1].strategy.calls
    assert trainers[1].strategy.calls == [(2, "broadcast"), (4, "broadcast"), (6, "broadcast")]
    assert [t.global_step for t in trainers] == [6, 6]
    assert [m.stop_reason for m in monitors] == [None, None]
