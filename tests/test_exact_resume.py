"""Stopped and rerun through `python train.py` == never stopped, bit for bit, with every default
callback and validation on (the unit test in test_resume.py runs a bare Trainer). A run that a
kill stops runs in a subprocess; the others, a run that signals itself included (its handler is
the run's, put back after it), run in the test process (tests/in_process.py). Signals sent from
outside a real process: test_train_e2e.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY_LORA, run_train, tiny_classifier_job
from tests.in_process import train_here
from tests.same_state import assert_same

# tests.signal_at in the child, and the laptrain this process imports (PYTHONPATH: a worktree's src)
ROOT = str(Path(__file__).resolve().parents[1])
HOOKS = {"PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}


def signal_at(signum: str, **at: int) -> list[str]:
    return [
        "+callbacks.sig._target_=tests.signal_at.SignalAt",
        f"+callbacks.sig.signum={signum}",
        *(f"+callbacks.sig.{k}={v}" for k, v in at.items()),
    ]


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def killed(args: list[str]) -> bool:
    """The run SIGKILLs itself (tests.signal_at's KillAt): a process of its own."""
    return any("signal_at.KillAt" in arg for arg in args)


def run_ok(args: list[str], tmp_path: Path, code: int = 0) -> str:
    run = run_train if killed(args) else train_here
    done = run(args, tmp_path, env=HOOKS)
    assert done.returncode == code, (done.returncode, done.stderr[-3000:])
    return done.stdout


def assert_same_run(tmp_path: Path, straight: str, resumed: str) -> None:
    a, b = tmp_path / "outputs" / straight, tmp_path / "outputs" / resumed
    last_a, last_b = load(a / "checkpoints" / "last.ckpt"), load(b / "checkpoints" / "last.ckpt")
    assert last_a["global_step"] == last_b["global_step"]
    for key in ("state_dict", "optimizer_states", "lr_schedulers"):
        assert_same(last_a[key], last_b[key], key)  # every tensor torch.equal
    # the same checkpoints kept (no best-step<N>.ckpt from the stop) and the same final metrics
    names = lambda run: sorted(p.name for p in (run / "checkpoints").iterdir())  # noqa: E731
    assert names(a) == names(b)
    if (a / "metrics.json").exists():
        assert untimed(a / "metrics.json") == untimed(b / "metrics.json")


def untimed(metrics: Path) -> dict:
    """metrics.json without the rates a step's wall time gives (TRM logs samples and puzzles per
    second at every step): the clock is not part of the state a resume restores."""
    return {k: v for k, v in json.loads(metrics.read_text()).items() if not k.endswith("_per_s")}


def classifier_args(tmp_path: Path, *extra: str) -> list[str]:
    """The tiny classifier job with the default trainer config (``trainer.deterministic`` is
    false, as users run it)."""
    return [
        *tiny_classifier_job(tmp_path),  # 192 train rows / 16 = 12 batches per epoch
        "+trainer.limit_test_batches=2",
        *extra,
    ]


def test_sigterm_mid_accumulation_before_a_validation_resumes_bit_identical(tmp_path):
    """SIGTERM arrives in batch 11 of 12, in the middle of an accumulation of 2, and the epoch's
    validation follows batch 12: the stop waits for the optimizer step, the validation and its
    checkpoints, and happens after the next step (global step 7). The rerun ends where a run
    never stopped ends: same weights, optimizer and scheduler state, checkpoints and metrics."""
    args = classifier_args(tmp_path, "trainer.max_epochs=2", "trainer.accumulate_grad_batches=2")
    run_ok([*args, "run_name=straight"], tmp_path)
    out = run_ok([*args, "run_name=stopped", *signal_at("SIGTERM", batch=11)], tmp_path, 143)
    assert "stopped at global step 7" in out
    stopped = tmp_path / "outputs" / "stopped" / "checkpoints"
    assert load(stopped / "last.ckpt")["global_step"] == 7
    assert sorted(p.name for p in stopped.iterdir()) == ["best-step6.ckpt", "last.ckpt"]
    out = run_ok([*args, "run_name=stopped"], tmp_path)
    assert "global step 7" in out
    assert_same_run(tmp_path, "straight", "stopped")


SLOW_CASES = {
    # mid-epoch, nothing special about the batch
    "sigint-mid-epoch": (["trainer.max_epochs=2"], signal_at("SIGINT", step=5, times=2), 130),
    # the epoch's last batch: the stop waits past the validation
    "sigterm-last-batch": (["trainer.max_epochs=2"], signal_at("SIGTERM", step=12), 143),
    # right after a validation (the first batch of epoch 1)
    "sigint-after-validation": (
        ["trainer.max_epochs=2"],
        signal_at("SIGINT", step=13, times=2),
        130,
    ),
    # a session budget that is spent at once: stops at the first batch boundary, exit 75 (paused)
    "session-budget": (
        ["trainer.max_epochs=2"],
        ["callbacks.session_budget.max_minutes=0.00001"],
        75,
    ),
    # validation every 5 batches inside the epoch, signal on such a batch
    "sigterm-mid-epoch-validation": (
        ["trainer.max_epochs=2", "trainer.val_check_interval=5"],
        signal_at("SIGTERM", step=5),
        143,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW_CASES)
def test_every_kind_of_stop_resumes_bit_identical(tmp_path, case):
    extra, stopper, code = SLOW_CASES[case]
    args = classifier_args(tmp_path, *extra)
    run_ok([*args, "run_name=straight"], tmp_path)
    run_ok([*args, "run_name=stopped", *stopper], tmp_path, code)
    run_ok([*args, "run_name=stopped"], tmp_path)
    assert_same_run(tmp_path, "straight", "stopped")


ASKED = {
    "checkpoint-now": [
        "+callbacks.ask._target_=tests.signal_at.RequestAt",
        "+callbacks.ask.step=5",
    ],
    "ctrl-c": signal_at("SIGINT", step=5),
}


@pytest.mark.slow
@pytest.mark.parametrize("asked", ASKED)
def test_a_checkpoint_on_request_changes_nothing_and_resumes_bit_identical_after_a_kill(
    tmp_path, asked
):
    """`laptrain checkpoint` (its request file) or a first Ctrl-C in step 5: the run saves there
    and goes on; run to the end it ends as a run never asked, and SIGKILLed in step 9 (nothing
    saves) its rerun resumes from step 5 and ends the same, bit for bit."""
    args = classifier_args(
        tmp_path, "trainer.max_epochs=2", "callbacks.graceful_stop.check_every_s=0"
    )
    ask = ASKED[asked] + (
        ["+callbacks.ask.run_dir=${paths.output_dir}"] if asked == "checkpoint-now" else []
    )
    run_ok([*args, "run_name=straight"], tmp_path)
    out = run_ok([*args, "run_name=asked", *ask], tmp_path)
    assert "saved step 5 to" in out
    assert_same_run(tmp_path, "straight", "asked")

    kill = ["+callbacks.kill._target_=tests.signal_at.KillAt", "+callbacks.kill.step=9"]
    run_ok([*args, "run_name=killed", *ask, *kill], tmp_path, -9)
    assert load(tmp_path / "outputs" / "killed" / "checkpoints" / "last.ckpt")["global_step"] == 5
    out = run_ok([*args, "run_name=killed"], tmp_path)
    assert "global step 5" in out
    assert_same_run(tmp_path, "straight", "killed")


def test_trm_stopped_and_rerun_is_bit_identical(tmp_path):
    """The default trainer config (not deterministic), a stop between two validations."""
    args = [
        "hardware=cpu",
        "experiment=trm_sudoku",
        "trainer.max_steps=8",
        "trainer.val_check_interval=4",
        "data.batch_size=16",
        "data.train_size=64",
        "data.val_size=16",
        "data.test_size=16",
    ]
    run_ok([*args, "run_name=straight"], tmp_path)
    run_ok([*args, "run_name=stopped", *signal_at("SIGTERM", step=6)], tmp_path, 143)
    run_ok([*args, "run_name=stopped"], tmp_path)
    assert_same_run(tmp_path, "straight", "stopped")


def test_lora_stopped_and_rerun_is_bit_identical(tmp_path):
    """The default trainer config (not deterministic), LoRA dropout on: SIGTERM at step 3 of 4,
    a validation at step 2 before it; the rerun ends with the straight run's adapter and AdamW
    moments, tensor for tensor."""
    args = [
        *TINY_LORA,
        "data.builder.modules=[json,csv,base64,shlex,heapq,bisect]",
        "data.vocab_size=512",
        "data.max_length=64",
        "data.batch_size=4",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        "test=false",
    ]
    run_ok([*args, "run_name=straight"], tmp_path)
    run_ok([*args, "run_name=stopped", *signal_at("SIGTERM", step=3)], tmp_path, 143)
    assert "global step 3," in run_ok([*args, "run_name=stopped"], tmp_path)
    assert_same_run(tmp_path, "straight", "stopped")
