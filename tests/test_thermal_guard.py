"""ThermalGuard: scalars, cooling breaks by state and by drift, the hourly cap, stops, resume."""

from __future__ import annotations

from unittest.mock import Mock

import pytest
import torch
from lightning.pytorch import seed_everything
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel

from laptrain.callbacks.thermal_guard import ThermalGuard
from laptrain.callbacks.throughput_drift import CoolingBudget, ThroughputDrift
from laptrain.hardware.thermal import ThermalReading
from tests.conftest import quiet_trainer
from tests.fake_ranks import two_ranks
from tests.fakes import FakeProbe, FakeThermal

NOMINAL, SERIOUS = ThermalReading(level=0), ThermalReading(level=2)


class FakeClock:
    """``time.monotonic`` and ``time.sleep`` that only move when told to."""

    def __init__(self) -> None:
        self.now, self.slept = 1000.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class TimedModel(BoringModel):
    """Each training step takes ``step_seconds[i]`` on the fake clock (throttling = slower steps)."""

    def __init__(self, clock: FakeClock, step_seconds: list[float] | None = None) -> None:
        super().__init__()
        self.clock, self.step_seconds = clock, step_seconds or []

    def training_step(self, batch, batch_idx):
        i = self.global_step
        self.clock.now += self.step_seconds[i] if i < len(self.step_seconds) else 1.0
        return super().training_step(batch, batch_idx)


def fit(guard: ThermalGuard | None, model: BoringModel, steps: int, tmp_path, **kwargs) -> Mock:
    logger = Mock()
    logger.save_dir = str(tmp_path)
    trainer = quiet_trainer(
        accelerator="cpu",
        max_steps=steps,
        limit_val_batches=0,
        logger=logger,
        callbacks=[guard] if guard else [],
        default_root_dir=tmp_path,
        **kwargs,
    )
    trainer.fit(model)
    return logger


def thermal_calls(logger: Mock) -> list[tuple[int, dict]]:
    calls = [
        (c.kwargs.get("step"), c.args[0] if c.args else c.kwargs["metrics"])
        for c in logger.log_metrics.call_args_list
    ]
    return [(step, m) for step, m in calls if any(k.startswith("thermal/") for k in m)]


def test_drift_compares_window_median_with_early_baseline():
    drift = ThroughputDrift(warmup=2, baseline=3, window=3)
    for seconds in (9.0, 9.0, 1.0, 1.0, 1.2):  # warm-up steps are ignored
        drift.update(seconds)
    assert drift.baseline_s == 1.0 and drift.drift_pct() is None
    for seconds in (1.5, 1.5, 100.0):
        drift.update(seconds)
    assert drift.drift_pct() == pytest.approx(50.0)
    drift.restart_window()
    assert drift.drift_pct() is None


def test_cooling_budget_caps_breaks_per_rolling_hour():
    budget = CoolingBudget(break_seconds=30, max_seconds_per_hour=50)
    assert budget.allowed(0.0) == 30
    budget.record(0.0, 30)
    assert budget.allowed(100.0) == 20
    budget.record(100.0, 20)
    assert budget.allowed(200.0) == 0
    assert budget.allowed(3600.0) == 30  # the first break left the window


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("hot_level", 0, "thermal_guard.hot_level"),
        ("drift_threshold_pct", -1.0, "thermal_guard.drift_threshold_pct"),
        ("check_every_n_steps", 0, "thermal_guard.check_every_n_steps"),
        ("break_seconds", 0.0, "thermal_guard.break_seconds"),
        ("max_break_seconds_per_hour", -1.0, "thermal_guard.max_break_seconds_per_hour"),
        ("baseline_steps", 0, "baseline_steps"),
    ],
)
def test_bad_values_name_their_config_key(key, value, match):
    with pytest.raises(ValueError, match=match):
        ThermalGuard(**{key: value})


def test_serious_state_triggers_a_logged_break(tmp_path):
    clock = FakeClock()
    source = FakeThermal([NOMINAL, SERIOUS, NOMINAL])
    probe = FakeProbe(kind="mps")
    guard = ThermalGuard(
        source=source,
        check_every_n_steps=2,
        break_seconds=5,
        drift_threshold_pct=None,
        probe=probe,
        clock=clock,
        sleep=clock.sleep,
    )
    logger = fit(guard, TimedModel(clock), 6, tmp_path)
    assert thermal_calls(logger) == [
        (2, {"thermal/state": 0.0}),
        (4, {"thermal/state": 2.0, "thermal/cooling_break_s": 5.0}),
        (6, {"thermal/state": 0.0}),
    ]
    assert clock.slept == [1.0] * 5  # slices, so that a stop request ends the break early
    assert guard.breaks == 1 and guard.cooling_s == 5.0
    assert guard.summary()["worst_state"] == "serious"
    assert guard.events == [{"step": 4, "reason": "thermal state serious", "s": 5.0}]
    assert probe.calls.count("synchronize") == 6  # before every clock read


def test_drift_triggers_a_break_without_any_thermal_source(tmp_path):
    clock = FakeClock()
    steps = [1.0] * 4 + [1.6] * 4  # the machine throttles after step 4: 60 % slower
    guard = ThermalGuard(
        use_os_source=False,
        warmup_steps=0,
        baseline_steps=4,
        window_steps=2,
        check_every_n_steps=2,
        drift_threshold_pct=25,
        break_seconds=3,
        probe=FakeProbe(),
        clock=clock,
        sleep=clock.sleep,
    )
    logger = fit(guard, TimedModel(clock, steps), 8, tmp_path)
    assert thermal_calls(logger) == [
        (6, {"thermal/drift_pct": pytest.approx(60.0), "thermal/cooling_break_s": 3.0}),
        (8, {"thermal/drift_pct": pytest.approx(60.0), "thermal/cooling_break_s": 3.0}),
    ]
    assert guard.summary()["source"] == "none (step-time drift only)"


def test_hourly_cap_stops_breaks_and_warns_once(tmp_path):
    clock = FakeClock()
    guard = ThermalGuard(
        source=FakeThermal([SERIOUS]),
        check_every_n_steps=1,
        break_seconds=10,
        max_break_seconds_per_hour=25,
        drift_threshold_pct=None,
        probe=FakeProbe(),
        clock=clock,
        sleep=clock.sleep,
    )
    with pytest.warns(UserWarning, match="cooling budget is spent"):
        fit(guard, TimedModel(clock), 5, tmp_path)
    assert [e["s"] for e in guard.events] == [10.0, 10.0, 5.0]


def test_breaks_leave_the_weights_unchanged(tmp_path):
    def trained(guard):
        seed_everything(7)
        model = BoringModel()
        fit(guard, model, 8, tmp_path)
        return {k: v.clone() for k, v in model.state_dict().items()}

    clock = FakeClock()
    guard = ThermalGuard(
        source=FakeThermal([SERIOUS]),
        check_every_n_steps=2,
        break_seconds=2,
        drift_threshold_pct=None,
        probe=FakeProbe(),
        clock=clock,
        sleep=clock.sleep,
    )
    with_breaks = trained(guard)
    assert guard.breaks == 4
    without = trained(None)
    assert with_breaks.keys() == without.keys()
    assert all(torch.equal(with_breaks[k], without[k]) for k in without)


class SignalDuringBreak(Callback):
    """Stands in for GracefulStop: a signal arrives while the guard sleeps; like GracefulStop,
    it (not the guard) stops the run at that batch boundary."""

    def __init__(self, clock: FakeClock) -> None:
        self.signal_received = None
        original = clock.sleep

        def sleep(seconds: float) -> None:
            original(seconds)
            if len(clock.slept) == 2:
                self.signal_received = 15

        clock.sleep = sleep

    def on_train_batch_end(self, trainer, *args) -> None:
        if self.signal_received is not None:
            trainer.should_stop = True


def test_a_signal_ends_the_break_and_stops_at_that_batch(tmp_path):
    clock = FakeClock()
    stopper = SignalDuringBreak(clock)
    guard = ThermalGuard(
        source=FakeThermal([SERIOUS]),
        check_every_n_steps=3,
        break_seconds=30,
        drift_threshold_pct=None,
        probe=FakeProbe(),
        clock=clock,
        sleep=lambda s: clock.sleep(s),
    )
    logger = Mock()
    trainer = quiet_trainer(
        accelerator="cpu",
        max_steps=20,
        limit_val_batches=0,
        logger=logger,
        callbacks=[guard, stopper],
        default_root_dir=tmp_path,
    )
    trainer.fit(TimedModel(clock))
    assert trainer.global_step == 3
    assert guard.events == [{"step": 3, "reason": "thermal state serious", "s": 2.0}]


def test_state_survives_a_checkpoint(tmp_path):
    clock = FakeClock()
    guard = ThermalGuard(
        source=FakeThermal([SERIOUS]),
        check_every_n_steps=2,
        break_seconds=4,
        drift_threshold_pct=None,
        warmup_steps=0,
        baseline_steps=2,
        probe=FakeProbe(),
        clock=clock,
        sleep=clock.sleep,
    )
    fit(guard, TimedModel(clock), 4, tmp_path)
    restored = ThermalGuard(source=FakeThermal(), probe=FakeProbe())
    restored.load_state_dict(guard.state_dict())
    assert restored.summary() == guard.summary()
    assert restored.drift.baseline_s == 1.0 and guard.state_dict()["version"] == 1


def test_hot_micro_batch_divisor_splits_batches_only_while_hot(tmp_path):
    from laptrain.callbacks.oom_backoff import OOMBackoff
    from tests.test_oom_backoff import ChunkedModel, PlainModel

    seed_everything(3)
    plain = PlainModel()
    fit(None, plain, 6, tmp_path)

    clock = FakeClock()
    guard = ThermalGuard(
        source=FakeThermal([SERIOUS, NOMINAL]),
        check_every_n_steps=2,
        break_seconds=1,
        drift_threshold_pct=None,
        hot_micro_batch_divisor=4,
        probe=FakeProbe(),
        clock=clock,
        sleep=clock.sleep,
    )
    backoff = OOMBackoff(every_n_steps=1, probe=FakeProbe())
    seed_everything(3)
    model = ChunkedModel()
    logger = Mock()
    trainer = quiet_trainer(
        accelerator="cpu",
        max_steps=6,
        limit_val_batches=0,
        logger=logger,
        callbacks=[guard, backoff],
        default_root_dir=tmp_path,
    )
    trainer.fit(model)
    logged = [
        c.args[0] for c in logger.log_metrics.call_args_list if "oom/accumulation" in c.args[0]
    ]
    # hot at the check after step 2, nominal again after step 4
    assert [m["oom/accumulation"] for m in logged] == [1.0, 1.0, 4.0, 4.0, 1.0, 1.0]
    assert {m["oom/effective_batch"] for m in logged} == {8.0}
    assert model.samples_seen == 6 * 8
    for name, value in plain.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value)


def test_divisor_below_one_names_its_key():
    with pytest.raises(ValueError, match="thermal_guard.hot_micro_batch_divisor"):
        ThermalGuard(hot_micro_batch_divisor=0)


def test_ranks_take_rank_0s_cooling_breaks_with_the_same_collectives():
    """Rank 0 reads a serious thermal state, rank 1 has no reading: one broadcast per check on
    both, and both take rank 0's breaks (a rank that trains on meanwhile only waits for the
    other in the next all-reduce, and its step times and break counts no longer match)."""

    def make(rank: int) -> ThermalGuard:
        clock = FakeClock()
        return ThermalGuard(
            source=FakeThermal([SERIOUS] if rank == 0 else [None]),
            check_every_n_steps=2,
            break_seconds=5,
            drift_threshold_pct=None,
            probe=FakeProbe(),
            clock=clock,
            sleep=clock.sleep,
        )

    trainers, guards = two_ranks(make, batches=6)
    assert trainers[0].strategy.calls == trainers[1].strategy.calls
    assert trainers[0].strategy.calls == [(2, "broadcast"), (4, "broadcast"), (6, "broadcast")]
    assert [g.breaks for g in guards] == [3, 3]
    assert [g.cooling_s for g in guards] == [15.0, 15.0]
