"""PowerGuard: keep-awake on every exit path, the battery warning, stop and pause, report, resume."""

from __future__ import annotations

import json
import os
import signal
from unittest.mock import Mock

import pytest
import torch
from lightning.pytorch import seed_everything
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel

from laptrain.callbacks.graceful_stop import GracefulStop
from laptrain.callbacks.power_guard import PowerGuard
from laptrain.callbacks.run_report import RunReport
from laptrain.hardware.power import BatteryReading
from tests.conftest import CONF_FIXTURES, TINY, quiet_trainer, write_texts
from tests.fake_ranks import two_ranks
from tests.fakes import FakeBattery
from tests.in_process import train_here
from tests.test_power import awake

PLUGGED, HALF = BatteryReading(90.0, True), BatteryReading(50.0, False, 3600)


class FakeClock:
    def __init__(self) -> None:
        self.now, self.slept = 0.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class StepModel(BoringModel):
    """Each step takes 1 s on the fake clock; ``action(step)`` runs inside the step (raise, signal)."""

    def __init__(self, clock: FakeClock | None = None, action=None) -> None:
        super().__init__()
        self.clock, self.action = clock, action

    def training_step(self, batch, batch_idx):
        if self.clock:
            self.clock.now += 1.0
        if self.action:
            self.action(self.global_step)
        return super().training_step(batch, batch_idx)


class HolderSeen(Callback):
    """Records at each batch end whether the guard's keep-awake holder is running."""

    def __init__(self, guard: PowerGuard) -> None:
        self.guard, self.held = guard, []

    def on_train_batch_end(self, trainer, *args) -> None:
        self.held.append(self.guard.awake.held)


def guard_with(battery=None, clock=None, **kwargs) -> PowerGuard:
    clock = clock or FakeClock()
    kwargs.setdefault("awake", awake())
    return PowerGuard(
        battery=FakeBattery(list(battery)) if battery is not None else FakeBattery([PLUGGED]),
        clock=clock,
        sleep=clock.sleep,
        **kwargs,
    )


def fit(guard, tmp_path, steps=6, model=None, callbacks=(), ckpt=None, **kwargs):
    logger = Mock()
    logger.save_dir = str(tmp_path)
    trainer = quiet_trainer(
        last_ckpt=tmp_path / "ckpt" / "last.ckpt",
        accelerator="cpu",
        max_steps=steps,
        limit_val_batches=0,
        logger=logger,
        callbacks=[guard, *callbacks],
        default_root_dir=tmp_path,
        **kwargs,
    )
    trainer.fit(model or StepModel(guard.clock), ckpt_path=ckpt)
    return trainer, logger


def power_calls(logger: Mock) -> list[tuple[int, dict]]:
    calls = [(c.kwargs.get("step"), c.args[0]) for c in logger.log_metrics.call_args_list]
    return [(s, m) for s, m in calls if any(k.startswith("power/") for k in m)]


def test_caffeinate_is_held_during_fit_and_ended_at_a_normal_end(tmp_path, caplog):
    guard = guard_with()
    seen = HolderSeen(guard)
    fit(guard, tmp_path, callbacks=[seen])
    assert guard.awake.spawn.commands == [["/usr/bin/caffeinate", "-i", "-w", str(os.getpid())]]
    assert seen.held == [True] * 6
    assert guard.awake.spawn.processes[0].terminated == 1 and not guard.awake.held
    assert "caffeinate -i -w" in caplog.text and "keep_awake=false turns this off" in caplog.text


def test_caffeinate_is_ended_when_training_raises(tmp_path):
    def crash(step):
        if step == 2:
            raise RuntimeError("boom")

    guard = guard_with()
    with pytest.raises(RuntimeError, match="boom"):
        fit(guard, tmp_path, model=StepModel(action=crash))
    assert guard.awake.spawn.processes[0].terminated == 1


def test_caffeinate_is_ended_after_ctrl_c_graceful_and_abrupt(tmp_path):
    # a Ctrl-C that stops (first_ctrl_c=stop): GracefulStop stops at the batch boundary; the
    # holder lasts until then
    guard = guard_with()
    seen = HolderSeen(guard)
    stop = GracefulStop(first_ctrl_c="stop")

    def ctrl_c(step):
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)

    trainer, _ = fit(guard, tmp_path, model=StepModel(action=ctrl_c), callbacks=[stop, seen])
    assert stop.signal_received == signal.SIGINT and trainer.global_step == 3
    assert seen.held == [True] * 3 and guard.awake.spawn.processes[0].terminated == 1

    # a KeyboardInterrupt in the step (second Ctrl-C): Lightning's on_exception, then exit 1
    def interrupt(step):
        raise KeyboardInterrupt

    guard = guard_with()
    try:
        with pytest.raises(SystemExit):
            fit(guard, tmp_path / "abrupt", model=StepModel(action=interrupt))
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Lightning set SIG_IGN
    assert guard.awake.spawn.processes[0].terminated == 1


def test_linux_holder_that_cannot_start_is_logged_and_nothing_else_changes(tmp_path, caplog):
    holder = awake("linux", code=1, stderr="Failed to connect to bus\n")
    trainer, _ = fit(guard_with(awake=holder), tmp_path, steps=2)
    assert holder.spawn.commands[0][0] == "systemd-inhibit"
    assert "exited at once (code 1: Failed to connect to bus); sleep not held" in caplog.text
    assert trainer.global_step == 2

    off = guard_with(keep_awake=False)
    fit(off, tmp_path / "off", steps=2)
    assert off.awake.spawn.commands == [] and off.summary()["keep_awake"] == "off"


def test_starting_on_battery_warns_once_with_the_key_to_silence_it(tmp_path):
    guard = guard_with([HALF], check_every_n_steps=2)
    with pytest.warns(UserWarning, match="warn_on_battery=false silences this") as caught:
        _, logger = fit(guard, tmp_path, steps=4)
    battery_warnings = [w for w in caught if "training on battery" in str(w.message)]
    assert len(battery_warnings) == 1
    assert "50 %, about 1 h 00 min left" in str(battery_warnings[0].message)
    assert "not measured yet" in str(battery_warnings[0].message)
    # read at the start (step 0), the first step and every 2nd: power/* scalars for TensorBoard
    assert power_calls(logger) == [
        (step, {"power/percent": 50.0, "power/plugged": 0.0}) for step in (0, 1, 2, 4)
    ]
    assert guard.battery_s == 4.0  # every step trained on battery (1 s each on the fake clock)


def test_the_warning_states_the_measured_cost_from_earlier_sessions(tmp_path):
    earlier = guard_with()
    earlier.step_time = {"battery": [10, 15.0], "plugged": [20, 20.0]}
    guard = guard_with([HALF])
    guard.load_state_dict(earlier.state_dict())
    with pytest.warns(UserWarning, match=r"1\.5 s on battery vs 1 s plugged in \(\+50 %\)"):
        fit(guard, tmp_path, steps=1)


def test_plugged_in_or_no_battery_stays_quiet(tmp_path, recwarn, caplog):
    _, logger = fit(guard_with([PLUGGED]), tmp_path, steps=2)
    assert power_calls(logger)[0] == (0, {"power/percent": 90.0, "power/plugged": 1.0})
    desktop = guard_with([])
    _, logger = fit(desktop, tmp_path / "desktop", steps=2)
    assert power_calls(logger) == [] and "no battery found" in caplog.text
    assert desktop.summary()["battery"] == "none"
    assert not [w for w in recwarn if "power:" in str(w.message)]


def test_low_battery_checkpoints_at_the_boundary_stops_and_the_rerun_continues(tmp_path):
    ckpt = tmp_path / "ckpt"
    script = [HALF, HALF, BatteryReading(30.0, False), BatteryReading(19.0, False)]
    guard = guard_with(script, check_every_n_steps=2)
    stop = GracefulStop()
    with pytest.warns(UserWarning, match="Plug in and rerun the same command to resume"):
        trainer, _ = fit(guard, tmp_path, steps=10, callbacks=[stop])
    assert guard.stop_reason == "battery" and trainer.global_step == 4
    saved = torch.load(ckpt / "last.ckpt", weights_only=False)
    assert (saved["global_step"], saved["epoch"]) == (4, 0)
    assert not (ckpt / "last.ckpt.stop").exists()
    assert guard.summary()["stopped_on_battery"] is True
    assert guard.summary()["lowest_percent_on_battery"] == 19.0

    again = guard_with([PLUGGED])
    trainer, _ = fit(
        again,
        tmp_path,
        steps=10,
        callbacks=[GracefulStop()],
        ckpt=str(ckpt / "last.ckpt"),
    )
    assert again.stop_reason is None and trainer.global_step == 10
    assert again.summary()["train_s_on_battery"] == 4.0  # carried over in the checkpoint


def test_on_battery_above_the_threshold_training_goes_on(tmp_path):
    guard = guard_with([BatteryReading(21.0, False)], check_every_n_steps=1, min_percent=20)
    with pytest.warns(UserWarning, match="training on battery"):
        trainer, _ = fit(guard, tmp_path, steps=3)
    assert trainer.global_step == 3 and guard.stop_reason is None


def trained_weights(guard, tmp_path) -> dict[str, torch.Tensor]:
    seed_everything(7)
    model = StepModel(guard.clock if guard else None)
    quiet_trainer(
        accelerator="cpu",
        max_steps=6,
        limit_val_batches=0,
        callbacks=[guard] if guard else [],
        default_root_dir=tmp_path,
    ).fit(model)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_pause_on_battery_waits_for_the_charger_and_leaves_the_weights_unchanged(tmp_path, caplog):
    clock = FakeClock()
    # start and step 1 plugged; unplugged at the check after step 2; the charger is back 20 s later
    script = [PLUGGED, PLUGGED, HALF, BatteryReading(49.0, False), PLUGGED]
    guard = guard_with(
        script, clock, check_every_n_steps=2, pause_on_battery=True, pause_check_seconds=10
    )
    paused = trained_weights(guard, tmp_path)
    assert guard.pauses == 1 and guard.paused_s == 20.0 and guard.cooling_s == 20.0
    assert guard.events == [{"step": 2, "kind": "pause", "reason": "on battery", "s": 20.0}]
    assert "paused at step 2 on battery (50 %" in caplog.text
    assert "charger back after a pause of 20 s" in caplog.text
    plain = trained_weights(None, tmp_path)
    assert all(torch.equal(paused[k], plain[k]) for k in plain)


def test_pause_that_drains_the_battery_ends_in_the_battery_stop(tmp_path):
    clock = FakeClock()
    script = [PLUGGED, HALF, BatteryReading(25.0, False), BatteryReading(15.0, False)]
    guard = guard_with(
        script,
        clock,
        check_every_n_steps=1,
        pause_on_battery=True,
        pause_check_seconds=60,
    )
    with pytest.warns(UserWarning, match="battery at 15 %"):
        trainer, _ = fit(guard, tmp_path, steps=5)
    assert trainer.global_step == 1 and guard.stop_reason == "battery"
    assert [e["kind"] for e in guard.events] == ["stop", "pause"] and guard.paused_s == 120.0
    assert (tmp_path / "ckpt" / "last.ckpt").exists()


def test_report_has_a_power_section_and_battery_points(tmp_path):
    clock = FakeClock()
    guard = guard_with([HALF], clock)
    report = RunReport(output_dir=str(tmp_path), every_n_steps=2, clock=clock)
    with pytest.warns(UserWarning, match="training on battery"):
        fit(guard, tmp_path, steps=4, callbacks=[report])
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["power"]["start_percent"] == 50.0 and written["power"]["battery"] == "fake"
    assert written["power"]["train_s_on_battery"] == 4.0
    assert [(p["battery_percent"], p["plugged"]) for p in written["history"]] == [(50.0, False)] * 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_percent": 100}, "power_guard.min_percent"),
        ({"check_every_n_steps": 0}, "power_guard.check_every_n_steps"),
        ({"pause_check_seconds": 0}, "power_guard.pause_check_seconds"),
    ],
)
def test_bad_values_name_their_config_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PowerGuard(**kwargs)


# slow (~19 s): the in-process battery tests above cover the stop; this is its train.py proof
@pytest.mark.slow
def test_train_py_stops_on_a_low_battery_and_the_rerun_resumes_from_that_step(tmp_path):
    """Acceptance: an Apple profile on CPU with a scripted battery (tests/conf/callbacks)."""
    args = [
        "hardware=m2_air",
        "hardware.accelerator=cpu",
        "hardware.batch_size=8",
        f"hydra.searchpath=[file://{CONF_FIXTURES}]",
        "callbacks.thermal_guard.break_seconds=0.2",
        "model=tiny_classifier",
        "data=text_csv",
        f"data.files.train={write_texts(tmp_path / 'texts.csv', rows=120)}",
        "run_name=power",
        "trainer.max_epochs=1",
        "trainer.max_steps=6",
        "trainer.log_every_n_steps=2",
        "test=false",
        *TINY,
    ]
    first = train_here([*args, "callbacks=fake_battery_low"], tmp_path)
    out = first.stdout + first.stderr
    assert first.returncode == 75, first.stderr[-3000:]  # paused: rerun later
    assert "battery at 18 % (below callbacks.power_guard.min_percent=20) at step 4" in out
    assert "Plug in and rerun the same command to resume" in out
    assert "memory: macOS memory pressure is warning (yellow in Activity Monitor)" in out
    assert "stopped (battery) at global step 4" in out
    run = tmp_path / "outputs" / "power"
    report = json.loads((run / "report.json").read_text())
    assert report["run"]["status"] == "stopped (battery); resume with the same command"
    assert report["power"]["stopped_on_battery"] and report["power"]["start_percent"] == 31.0
    events = b"".join(p.read_bytes() for p in (run / "tensorboard").rglob("events.out.*"))
    assert b"power/percent" in events and b"power/plugged" in events

    second = train_here([*args, "callbacks=fake_mps"], tmp_path)  # on the charger again
    assert second.returncode == 0, second.stderr[-3000:]
    out = second.stdout + second.stderr  # the guards' lines, as `callbacks=fake_mps` shows them
    assert "keep_awake=false turns this off" in out  # what holds sleep off here, or why nothing
    assert "power: training on battery (64 %, about 2 h 05 min left)" in out
    assert "(global step 4, epoch 0)" in second.stdout
    report = json.loads((run / "report.json").read_text())
    assert report["run"]["status"] == "finished" and report["run"]["sessions"] == 2
    assert report["run"]["global_step"] == 6 and not report["power"]["stopped_on_battery"]
    assert report["power"]["events"][0]["kind"] == "stop"  # the first session's, kept


@pytest.mark.parametrize("rank1_script", [[], [HALF, None]], ids=["no-battery", "probe-fails"])
def test_a_battery_probe_failing_on_one_rank_keeps_the_collectives_together(rank1_script):
    """Rank 1 finds no battery at the start, or its probe fails at a check, while rank 0 reads
    its battery running low: both broadcast at the start and at every check, and both stop at
    rank 0's step with a save (under DDP rank 0 would otherwise wait in a broadcast alone)."""
    low = BatteryReading(19.0, False)

    def make(rank: int) -> PowerGuard:
        script = [HALF, HALF, low] if rank == 0 else rank1_script
        return guard_with(script, check_every_n_steps=2)

    trainers, guards = two_ranks(make, batches=6)
    assert trainers[0].strategy.calls == trainers[1].strategy.calls
    assert trainers[0].strategy.calls == [
        (0, "broadcast"),  # on_train_start: does rank 0 have a battery
        (1, "broadcast"),
        (2, "broadcast"),
        (2, "barrier"),  # the stop's checkpoint
    ]
    assert [t.global_step for t in trainers] == [2, 2]
    assert [g.stop_reason for g in guards] == ["battery", "battery"]


def test_a_pause_ends_on_rank_0s_verdict_on_every_rank():
    """Paused on battery: rank 0's battery drains below min_percent while rank 1 sees the charger
    back. Every slice of the pause is one broadcast on both ranks (when to read is a clock's
    call), and both stop at the same step with a save instead of rank 1 training on alone."""
    drained = BatteryReading(15.0, False)

    def make(rank: int) -> PowerGuard:
        script = [PLUGGED, HALF, drained] if rank == 0 else [PLUGGED, HALF, PLUGGED]
        return guard_with(
            script,
            check_every_n_steps=1,
            pause_on_battery=True,
            pause_check_seconds=10,
        )

    trainers, guards = two_ranks(make, batches=6)
    calls = trainers[0].strategy.calls
    assert calls == trainers[1].strategy.calls
    assert (
        calls[-1] == (1, "barrier") and calls.count((1, "broadcast")) == 1 + 11
    )  # 10 s, 1 s slices
    assert [t.global_step for t in trainers] == [1, 1]
    assert [g.stop_reason for g in guards] == ["battery", "battery"]
    assert [g.pauses for g in guards] == [1, 1]
