"""The callback contracts: stop reasons, report sections, the chunk divisor and state versions."""

from __future__ import annotations

import signal
import warnings
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from laptrain.callbacks.contracts import (
    PlotsPoints,
    Reports,
    SplitsMicroBatch,
    StateVersionWarning,
    StopsOnSignal,
    StopsRun,
    check_version,
    cooling_s,
    report_sections,
    signal_stop,
    stop_reason,
)
from laptrain.callbacks.graceful_stop import GracefulStop
from laptrain.callbacks.memory_monitor import MemoryMonitor
from laptrain.callbacks.oom_backoff import OOMBackoff
from laptrain.callbacks.report_writer import render_markdown
from laptrain.callbacks.rng_state import RNGState
from laptrain.callbacks.run_report import RunReport
from laptrain.callbacks.session_budget import SessionBudget
from laptrain.callbacks.thermal_guard import ThermalGuard
from laptrain.families.trm.ema import EMA
from tests.fakes import FakeProbe


class Pauses:
    """A stand-in guard that is no laptrain class: the contracts go by shape."""

    report_section = "pauses"

    def __init__(self) -> None:
        self.stop_reason: str | None = None
        self.cooling_s = 2.5

    def summary(self) -> dict[str, Any]:
        return {"pauses": 1}


def test_the_laptrain_callbacks_meet_their_contracts(tmp_path):
    assert isinstance(SessionBudget(), StopsRun) and isinstance(MemoryMonitor(), StopsRun)
    assert isinstance(GracefulStop(), StopsOnSignal)
    for guard, section in ((MemoryMonitor(), "memory"), (ThermalGuard(), "thermal")):
        assert isinstance(guard, Reports) and isinstance(guard, PlotsPoints)
        assert guard.report_section == section
    assert isinstance(OOMBackoff(), Reports) and isinstance(OOMBackoff(), SplitsMicroBatch)
    assert not isinstance(RunReport(), StopsRun) and not isinstance(EMA(), Reports)


def test_stop_reason_and_signal_read_any_callback_with_the_attribute(tmp_path):
    guard, stop = Pauses(), GracefulStop()
    callbacks = [object(), guard, stop]
    assert stop_reason(callbacks) is None and signal_stop(callbacks) is None
    guard.stop_reason, stop.signal_received = "swap", signal.SIGTERM
    assert stop_reason(callbacks) == "swap"
    assert signal_stop(callbacks) == signal.SIGTERM


def test_report_sections_collect_every_summary_and_the_markdown_shows_a_new_one():
    sections = report_sections([Pauses(), OOMBackoff(), object()])
    assert sections["pauses"] == {"pauses": 1} and sections["oom"]["backoffs"] == 0
    assert cooling_s([Pauses(), object()]) == 2.5
    text = render_markdown({"run": {"name": "r", "status": "finished"}, **sections})
    assert "## pauses" in text and "| pauses | 1 |" in text


def test_thermal_guard_sets_the_divisor_of_any_splitter_and_resets_it_when_cool():
    class Splitter:
        def __init__(self) -> None:
            self.chunk_divisor = 1

        def set_chunk_divisor(self, divisor: int) -> None:
            self.chunk_divisor = divisor

    splitter, backoff = Splitter(), OOMBackoff()
    trainer = SimpleNamespace(callbacks=[splitter, backoff])
    guard = ThermalGuard(hot_micro_batch_divisor=4)
    guard._split_while_hot(trainer, hot=True)
    assert splitter.chunk_divisor == backoff.chunk_divisor == 4
    assert backoff.chunk_size(10) == 3
    guard._split_while_hot(trainer, hot=False)
    assert splitter.chunk_divisor == backoff.chunk_divisor == 1
    ThermalGuard(hot_micro_batch_divisor=1)._split_while_hot(trainer, hot=True)
    assert backoff.chunk_divisor == 1  # divisor 1 = the guard never touches it


def test_chunk_divisor_below_one_is_refused():
    with pytest.raises(ValueError, match="chunk divisor must be >= 1"):
        OOMBackoff().set_chunk_divisor(0)


def test_check_version_warns_once_naming_what_is_reset():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_version("guard", {"version": 1}, 1, "x")
    with pytest.warns(StateVersionWarning) as record:
        assert not check_version("guard", {}, 1, "the peaks")
    (warning,) = record
    assert "guard" in str(warning.message) and "version None" in str(warning.message)
    assert "reset instead: the peaks" in str(warning.message)


# ----- each callback with state: an old checkpoint resets it, one warning, no crash -----------
def _oom() -> tuple[OOMBackoff, dict[str, Any]]:
    cb = OOMBackoff(probe=FakeProbe())
    cb.micro_batch, cb.events = 4, [{"step": 1}]
    return cb, cb.state_dict()


def _oom_reset(cb: OOMBackoff) -> bool:
    return cb.micro_batch is None and cb.events == []


def _thermal() -> tuple[ThermalGuard, dict[str, Any]]:
    cb = ThermalGuard()
    cb.breaks, cb.cooling_s, cb.events, cb.worst_level = 2, 60.0, [{"step": 3}], 2
    cb.drift.update(0.1)
    return cb, cb.state_dict()


def _thermal_reset(cb: ThermalGuard) -> bool:
    return (cb.breaks, cb.cooling_s, cb.events, cb.worst_level, cb.drift.seen) == (
        0,
        0.0,
        [],
        None,
        0,
    )


def _memory() -> tuple[MemoryMonitor, dict[str, Any]]:
    cb = MemoryMonitor()
    cb.peaks, cb.cleanups, cb.freed_mb = {"rss_mb": 100.0}, 3, 12.0
    return cb, cb.state_dict()


def _memory_reset(cb: MemoryMonitor) -> bool:
    return (cb.peaks, cb.cleanups, cb.freed_mb) == ({}, 0, 0.0)


def _report() -> tuple[RunReport, dict[str, Any]]:
    cb = RunReport()
    cb.totals["samples"], cb.history = 64, [{"step": 1}]
    return cb, cb.state_dict()


def _report_reset(cb: RunReport) -> bool:
    return cb.totals["samples"] == 0 and cb.history == [] and cb._wall_before == 0.0


def _ema() -> tuple[EMA, dict[str, Any]]:
    cb = EMA()
    cb._fitting, cb.updates, cb.last_step = True, 7, 7
    state = {"version": 1, "decay": 0.999, "updates": 7, "last_step": 7, "raw_weights": {}}
    return cb, state


def _ema_reset(cb: EMA) -> bool:
    return (cb.updates, cb.last_step, cb._pending_raw) == (0, 0, {})


STATEFUL = {
    "oom_backoff": (_oom, _oom_reset),
    "thermal_guard": (_thermal, _thermal_reset),
    "memory_monitor": (_memory, _memory_reset),
    "run_report": (_report, _report_reset),
    "ema": (_ema, _ema_reset),
}


@pytest.mark.parametrize("version", [None, 0, 2])
@pytest.mark.parametrize("name", sorted(STATEFUL))
def test_an_other_state_version_resets_the_callback_with_one_warning(name, version):
    make, was_reset = STATEFUL[name]
    cb, state = make()
    assert state["version"] == cb.STATE_VERSION
    if version is None:
        del state["version"]  # a checkpoint from before versions
    else:
        state["version"] = version
    with pytest.warns(StateVersionWarning) as record:
        cb.load_state_dict(state)
    assert len(record) == 1 and name in str(record[0].message)
    assert was_reset(cb)


@pytest.mark.parametrize("name", sorted(STATEFUL))
def test_the_current_version_loads_without_a_warning(name):
    make, was_reset = STATEFUL[name]
    cb, state = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error", StateVersionWarning)
        cb.load_state_dict(state)
    assert not was_reset(cb)


def test_rng_state_of_another_version_is_not_restored():
    rng = RNGState()
    state = {**rng.state_dict(), "version": 0}
    torch.rand(3)  # move on: a restore would rewind to ``state``
    now = torch.get_rng_state()
    with pytest.warns(StateVersionWarning, match="rng_state.*not bit-identical"):
        rng.load_state_dict(state)
    assert torch.equal(torch.get_rng_state(), now)
