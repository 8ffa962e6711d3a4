"""Early stopping (conf/callbacks/early_stopping.yaml, laptrain.callbacks.early_stopping) through
`python train.py`: off until patience is set, stops a run exit 0 with the report and `laptrain runs`
saying where, and a run stopped by a signal and rerun stops where a run never stopped stops, on the
same best checkpoint (torch.equal weights). ``min_delta=1`` makes the first validation the only
improvement an accuracy can make, so the stop is known in advance: patience 2 stops in epoch 3."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from laptrain.run_folder.listing import run_state
from tests.conftest import ROOT, compose_train
from tests.forked_train import run_python
from tests.in_process import train_here
from tests.new_project import new_project
from tests.test_exact_resume import classifier_args, load, run_ok, signal_at

SRC = str(Path(__import__("laptrain").__file__).parents[1])  # the laptrain under test
ROOT_PATH = str(ROOT)  # tests.signal_at in the child
EARLY = ["callbacks.early_stopping.patience=2", "callbacks.early_stopping.min_delta=1"]


def best_weights(run: Path) -> dict:
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    return load(best)["state_dict"]


def test_off_until_patience_is_set(tmp_path):
    out = run_ok(
        classifier_args(
            tmp_path, "trainer.max_epochs=3", "callbacks.early_stopping.min_delta=1", "run_name=off"
        ),
        tmp_path,
    )
    run = tmp_path / "outputs" / "off"
    assert "stopped early" not in out
    assert load(run / "checkpoints" / "last.ckpt")["global_step"] == 36  # 3 epochs of 12 steps


STOPS = {
    # SIGTERM in epoch 2 (step 18): saved there, exit 143
    "sigterm": (signal_at("SIGTERM", step=18), 143, 18),
    # killed in epoch 2 (step 14): nothing saves; last.ckpt is epoch 1's, written at its validation,
    # which must hold that validation's check (Lightning checks at epoch end, after that save)
    "kill": (
        ["+callbacks.kill._target_=tests.signal_at.KillAt", "+callbacks.kill.step=14"],
        -9,
        12,
    ),
}


# the kill case takes minutes of the fast suite's budget: slow, SIGTERM's case its fast twin
@pytest.mark.parametrize(
    "stop", [pytest.param(s, marks=pytest.mark.slow) if s == "kill" else s for s in STOPS]
)
def test_a_stopped_run_rerun_stops_early_where_one_never_stopped_does(tmp_path, stop):
    args = classifier_args(
        tmp_path,
        "trainer.max_epochs=6",
        "callbacks.model_checkpoint.save_top_k=1",
        *EARLY,
    )
    out = run_ok([*args, "run_name=straight"], tmp_path)
    assert "done at global step 36: stopped early at epoch 3 (best val/acc " in out
    straight = tmp_path / "outputs" / "straight"
    report = json.loads((straight / "report.json").read_text())
    line = "stopped early at epoch 3 (best val/acc"
    assert report["run"]["status"].startswith(f"finished: {line}")
    assert report["run"]["status"].endswith(" at epoch 1)")
    assert run_state(straight).status.startswith(f"done: {line}")
    assert load(straight / "checkpoints" / "last.ckpt")["global_step"] == 36

    stopper, code, saved = STOPS[stop]
    run_ok([*args, "run_name=cut", *stopper], tmp_path, code)
    cut = tmp_path / "outputs" / "cut"
    assert load(cut / "checkpoints" / "last.ckpt")["global_step"] == saved
    run_ok([*args, "run_name=cut"], tmp_path)
    assert load(cut / "checkpoints" / "last.ckpt")["global_step"] == 36
    for key, weights in best_weights(straight).items():
        assert torch.equal(weights, best_weights(cut)[key]), key
    assert json.loads((cut / "report.json").read_text())["run"]["status"] == report["run"]["status"]

    # the same command again: the run stays stopped (Lightning would train epochs 4-6)
    run_ok([*args, "run_name=cut"], tmp_path)
    assert load(cut / "checkpoints" / "last.ckpt")["global_step"] == 36


def test_a_watched_metric_the_module_never_logs_is_one_line_naming_those_it_logs(tmp_path):
    """Before: Lightning's RuntimeError traceback from EarlyStopping at the first validation."""
    args = classifier_args(
        tmp_path, "callbacks.early_stopping.patience=2", "callbacks.early_stopping.monitor=val/f2"
    )
    done = train_here([*args, "run_name=typo"], tmp_path)
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert errors == [
        "error: early stopping watches val/f2, which TextClassifierModule does not log (it logs: "
        "lr-AdamW/pg1, lr-AdamW/pg2, train/loss, val/acc, val/f1, val/loss): log it in "
        "validation_step with "
        "self.log('val/f2', value), or watch a logged one: callbacks.early_stopping.monitor=val/acc"
    ]
    assert not (tmp_path / "outputs" / "typo").exists()  # a first run: nothing of it is kept


@pytest.mark.slow  # 38 s; its fast twin: the default job's SIGTERM case above
def test_a_laptrain_new_module_stopped_and_rerun_stops_early_where_one_never_stopped_does(
    tmp_path,
):
    """The module and data `laptrain new` writes, through the clone's own train.py."""
    clone = new_project(tmp_path / "clone")
    args = [
        "model=my_task",
        "data=my_task",
        "hardware=cpu",
        "hardware.torch_threads=1",
        "data.rows=320",
        "data.batch_size=32",
        "trainer.max_epochs=6",
        "trainer.deterministic=true",
        "logger=none",
        "test=false",
        "callbacks.model_checkpoint.save_top_k=1",
        *EARLY,
    ]

    def train(*extra: str, code: int = 0) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT_PATH, SRC])}
        done = run_python([str(clone / "train.py"), *args, *extra], clone, env)
        assert done.returncode == code, done.stderr[-3000:]

    train("run_name=straight")
    straight = clone / "outputs" / "straight"
    steps = load(straight / "checkpoints" / "last.ckpt")["global_step"]
    epoch = steps // 3  # stopped in epoch 3
    assert run_state(straight).status.startswith("done: stopped early at epoch 3 (best val/acc")
    train("run_name=cut", *signal_at("SIGTERM", step=epoch + 2), code=143)
    train("run_name=cut")
    cut = clone / "outputs" / "cut"
    assert load(cut / "checkpoints" / "last.ckpt")["global_step"] == steps
    for key, weights in best_weights(straight).items():
        assert torch.equal(weights, best_weights(cut)[key]), key


@pytest.mark.parametrize(
    ("model", "monitor", "mode"),
    [("tiny_classifier", "val/acc", "max"), ("tiny_llama_lora", "val/loss", "min")],
)
def test_it_watches_the_model_s_metric_in_the_metric_s_mode(model, monitor, mode):
    cfg = compose_train(["hardware=cpu", f"model={model}"])
    early = cfg.callbacks.early_stopping
    assert (early.monitor, early.mode, early.patience) == (monitor, mode, None)
