"""A run builds only the callbacks that can act on it (laptrain.callbacks.acting): a guard the
profile turns off and a session budget without a limit are never in the Trainer; Lightning's dispatch per step stays as short as when they were built and
switched off; the console names the guards that are on."""

from __future__ import annotations

import importlib
from collections import Counter

import pytest
from lightning.pytorch.profilers import PassThroughProfiler

from laptrain.callbacks.acting import build_callbacks, guards_line
from laptrain.callbacks.memory_monitor import MemoryMonitor
from laptrain.callbacks.oom_backoff import OOMBackoff
from laptrain.callbacks.power_guard import PowerGuard
from laptrain.callbacks.session_budget import SessionBudget
from laptrain.callbacks.thermal_guard import ThermalGuard
from laptrain.checkpoints.trusted import TrustedGlobals
from laptrain.job.run import _make_trainer, build
from tests.conftest import compose_train
from tests.test_oom_backoff import ChunkedModel
from tests.test_user_errors import train_user
from tests.user_style import FAST, user_args, write_user_project

DEFAULT = {
    "model_checkpoint",
    "periodic_checkpoint",
    "memory_monitor",
    "thermal_guard",
    "power_guard",
    "oom_backoff",
    "nonfinite_guard",
    "session_budget",
    "graceful_stop",
    "rng_state",
    "loader_position",
    "lr_monitor",
    "progress_bar",
    "run_report",
}
IDLE_ON_CPU = {"memory_monitor", "thermal_guard", "power_guard", "session_budget"}
TRAIN_STEP_HOOKS = ("batch_start", "backward", "optimizer_step", "zero_grad", "train_batch_end")


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's project (``mytask``, model=mlp, data=blobs) importable from outside src/laptrain."""
    folder = write_user_project(tmp_path / "project")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(importlib.sys.modules, "mytask", raising=False)
    return folder


def user_run(project, tmp_path, *overrides: str):
    return compose_train(["model=mlp", "data=blobs", *overrides, *user_args(project)], tmp_path)


class CountsCallbackHooks(PassThroughProfiler):
    """Counts the callback hooks Lightning dispatches (each one inside a profiler action)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def start(self, action_name: str) -> None:
        if action_name.startswith("[Callback]"):
            self.calls[action_name] += 1


def test_a_cpu_run_of_a_users_module_builds_only_the_guards_that_act(project, tmp_path):
    cfg = user_run(project, tmp_path, "hardware=cpu", "trainer.max_epochs=1")
    datamodule, model, plan, _ = build(cfg, None, tmp_path / "run")
    trainer, callbacks, _, guards = _make_trainer(cfg, plan, model, datamodule, TrustedGlobals())
    built = {type(cb) for cb in trainer.callbacks}
    for idle in (MemoryMonitor, ThermalGuard, PowerGuard, SessionBudget):
        assert idle not in built, idle.__name__
    assert len(callbacks) == len(DEFAULT - IDLE_ON_CPU) + 1  # + the monitored-metric check
    assert guards == "guards: graceful stop, nonfinite, OOM backoff"  # it cuts the user's loader

    profiler = CountsCallbackHooks()
    trainer.profiler = profiler
    trainer.fit(model, datamodule=datamodule)
    per_step = sum(
        n
        for action, n in profiler.calls.items()
        if action.endswith(TRAIN_STEP_HOOKS) and "validation" not in action
    )
    # 11 calls a step: the 10 of the guards that acted before (the stop queue's among them) and
    # the OOM backoff's, which now acts on a user's module; 60 with Lightning's empty hooks too
    assert per_step / trainer.global_step <= 11, profiler.calls


def test_an_apple_profile_builds_the_laptop_guards_and_a_setting_turns_one_off(project, tmp_path):
    model = importlib.import_module("mytask").MLPModule()
    built = build_callbacks(user_run(project, tmp_path, "hardware=m2_air").callbacks, model)
    assert DEFAULT - {"session_budget"} == set(built)
    assert isinstance(built["thermal_guard"], ThermalGuard)
    line = guards_line(built)
    assert line == "guards: graceful stop, nonfinite, memory, thermal, power, OOM backoff"
    off = user_run(project, tmp_path, "hardware=m2_air", "callbacks.power_guard.enabled=false")
    assert "power_guard" not in build_callbacks(off.callbacks, model)


def test_a_session_limit_builds_its_guard_and_a_setting_turns_the_oom_backoff_off(
    project, tmp_path
):
    cfg = user_run(project, tmp_path, "hardware=cpu", "callbacks.session_budget.max_epochs=2")
    built = build_callbacks(cfg.callbacks, ChunkedModel())
    assert built["session_budget"].max_epochs == 2
    assert isinstance(built["oom_backoff"], OOMBackoff)
    assert guards_line(built) == "guards: graceful stop, nonfinite, OOM backoff, session budget"
    off = user_run(project, tmp_path, "hardware=cpu", "callbacks.oom_backoff.enabled=false")
    assert "oom_backoff" not in build_callbacks(off.callbacks, ChunkedModel())


def test_no_callbacks_and_a_users_own_callback(project, tmp_path):
    model = importlib.import_module("mytask").MLPModule()
    none = user_run(project, tmp_path, "hardware=cpu", "callbacks=none")
    assert build_callbacks(none.get("callbacks"), model) == {}
    assert guards_line({}) == "guards: none"
    own = user_run(
        project,
        tmp_path,
        "hardware=cpu",
        "callbacks=none",
        "+callbacks.early_stopping._target_=lightning.pytorch.callbacks.EarlyStopping",
        "+callbacks.early_stopping.monitor=val/loss",
    )
    built = build_callbacks(own.callbacks, model)
    assert list(built) == ["early_stopping"] and built["early_stopping"].monitor == "val/loss"


def test_train_py_with_no_callbacks_but_the_users_own_runs_and_says_no_guards(
    project, tmp_path, monkeypatch
):
    own = [
        "callbacks=none",
        "+callbacks.early_stopping._target_=lightning.pytorch.callbacks.EarlyStopping",
        "+callbacks.early_stopping.monitor=val/loss",
    ]
    args = ["model=mlp", "data=blobs", *FAST, *own, *user_args(project)]
    done = train_user(args, tmp_path, project, monkeypatch)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "guards: none\n" in done.stdout, done.stdout
    assert "done at global step 8\n" in done.stdout  # 240 rows, batch 32, one epoch
