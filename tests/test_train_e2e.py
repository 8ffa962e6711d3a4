"""`python train.py` end to end: artifacts, resume, signals, env, sweeps, bad input. In this process
(tests/in_process.py) where a new process is not the point; signals, DDP and the environment torch
reads at import run in a subprocess."""

from __future__ import annotations

import contextlib
import json
import math
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import NO_DROPOUT, TINY, TRAIN, run_train, write_texts
from tests.in_process import train_here
from tests.test_hparams import hparams_row

BASE = ["hardware=cpu", "model=tiny_classifier", "data=text_csv", "run_name=t", *TINY]


def data_args(tmp_path: Path) -> list[str]:
    return [f"data.files.train={write_texts(tmp_path / 'texts.csv')}"]


def ckpt_step(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])


def test_run_writes_checkpoint_events_and_finite_metrics_then_resumes(tmp_path):
    args = [*BASE, *data_args(tmp_path), "trainer.max_steps=4", "trainer.val_check_interval=2"]
    first = train_here(args, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    run = tmp_path / "outputs" / "t"
    assert ckpt_step(run / "checkpoints" / "last.ckpt") == 4
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    metrics = json.loads((run / "metrics.json").read_text())
    assert all(math.isfinite(v) for v in metrics.values())
    # 4 steps inside the lr warm-up leave the model at the uniform prior over the 3 labels, so the
    # losses sit at ln 3 (1.0989 measured; a wrong label count or a diverged head is far from it)
    # and the accuracy near chance, whose argmax over near-equal logits is not stable across
    # machines. That the model learns is test_text_classifier's tiny-classifier test.
    for key in ("val/loss", "test/loss"):
        assert abs(metrics[key] - math.log(3)) < 0.05, (key, metrics[key])
    assert {"val/acc", "val/f1", "test/acc", "test/f1"} <= metrics.keys()
    assert json.loads((run / "labels.json").read_text()) == ["cooking", "sports", "weather"]
    assert (run / "model" / "config.json").is_file() and (
        run / "tokenizer" / "tokenizer.json"
    ).is_file()

    # The same command with a larger budget continues from step 4, in the same folder.
    second = train_here(
        [*args[:-2], "trainer.max_steps=8", "trainer.val_check_interval=2"], tmp_path
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming from" in second.stdout and "global step 4" in second.stdout
    assert ckpt_step(run / "checkpoints" / "last.ckpt") == 8
    assert not (tmp_path / "outputs" / "t-2").exists()


# "val": laptrain's own handler already stopped there; "test" takes the same path as "sanity" (both
# slow, ~17 s each: the fast suite stays under 10 minutes on 2 cores)
@pytest.mark.parametrize(
    "stage",
    [
        "sanity",
        pytest.param("val", marks=pytest.mark.slow),
        pytest.param("test", marks=pytest.mark.slow),
    ],
)
def test_sigterm_in_any_stage_exits_143_with_the_hint_and_the_rerun_completes(
    tmp_path, stage, monkeypatch
):
    """Outside training Lightning's own handler ends the stage with a SystemExit of code 0; the
    run turns it into 143 and the resume hint, and the same command then finishes the run. Its
    process also shows the profile's environment reaching torch, which reads it at import (an
    exported value wins: test_checkpoint_on_request_and_a_first_ctrl_c_save_and_go_on...)."""
    args = [
        *BASE,
        *data_args(tmp_path),
        "trainer.max_steps=6",
        "trainer.val_check_interval=3",
        "trainer.num_sanity_val_steps=1",
        "+hardware.env.OMP_NUM_THREADS=1",
    ]
    signal_in = [
        "+callbacks.signal._target_=tests.rank_record.SignalIn",
        f"+callbacks.signal.stage={stage}",
    ]
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    stopped = run_train([*args, *signal_in], tmp_path)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "SIGTERM: stopped" in stopped.stdout and "Resume with the same command" in stopped.stdout
    run = tmp_path / "outputs" / "t"
    info = json.loads((run / "run_info.json").read_text())
    assert info["torch_threads"] == 1 and info["env_applied"] == {"OMP_NUM_THREADS": "1"}
    assert not (run / "metrics.json").exists()
    rerun = train_here(args, tmp_path)  # the signal was the first run's: this one may stay here
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "test/acc" in json.loads((run / "metrics.json").read_text())


# slow (~15 s): tests/test_run_folder_naming.py covers the folder choice without training
@pytest.mark.slow
def test_resume_false_keeps_the_old_run_and_starts_a_new_folder(tmp_path):
    # logger=none as well: the learning-rate monitor, which needs a logger, steps aside
    args = [*BASE, *data_args(tmp_path), "trainer.max_steps=2", "test=false", "logger=none"]
    first = train_here(args, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert not (tmp_path / "outputs" / "t" / "tensorboard").exists()
    fresh = train_here([*args, "resume=false"], tmp_path)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert "resuming" not in fresh.stdout
    assert ckpt_step(tmp_path / "outputs" / "t" / "checkpoints" / "last.ckpt") == 2
    assert ckpt_step(tmp_path / "outputs" / "t-2" / "checkpoints" / "last.ckpt") == 2


def wait_for(what, deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_checkpoint_on_request_and_a_first_ctrl_c_save_and_go_on_a_second_stops(tmp_path, capsys):
    """What a user does to a live run from another terminal and from its own: `laptrain
    checkpoint` and a first Ctrl-C each write last.ckpt and training goes on; a second Ctrl-C
    within 5 s stops with exit 130 and the resume hint. The user's exported OMP_NUM_THREADS wins
    over the profile's (the profile's alone: the SIGTERM test above)."""
    from laptrain.commands.cli import main as laptrain

    args = [
        *BASE,
        *data_args(tmp_path),
        "trainer.max_steps=100000",
        "trainer.max_epochs=1000",
        "test=false",
        "+hardware.env.OMP_NUM_THREADS=1",
    ]
    env = {**os.environ, "LAPTRAIN_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "2"}
    log = tmp_path / "train.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(TRAIN), *args],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        run = tmp_path / "outputs" / "t"
        wait_for(lambda: (run / "run_info.json").exists() or proc.poll() is not None)
        root = str(tmp_path / "outputs")
        assert laptrain(["checkpoint", "t", "--root", root, "--wait", "60"]) == 0
        asked = int(capsys.readouterr().out.split("saved step ")[1].split()[0])
        assert asked > 0 and proc.poll() is None  # it went on
        assert f"checkpoint on request: saved step {asked} to" in log.read_text()

        proc.send_signal(signal.SIGINT)
        wait_for(lambda: "Ctrl-C: saved step" in log.read_text() or proc.poll() is not None)
        saved = int(log.read_text().split("Ctrl-C: saved step ")[1].split()[0])
        assert saved > asked and "going on (Ctrl-C again within 5 s stops)" in log.read_text()
        time.sleep(0.5)
        assert proc.poll() is None  # training goes on
        proc.send_signal(signal.SIGINT)  # within the 5 s: stop
        assert proc.wait(timeout=120) == 128 + signal.SIGINT, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log.read_text()
    assert "Resume with the same command" in out
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert state["global_step"] > saved and state["optimizer_states"]
    # mid-epoch: the checkpoint must not count the interrupted epoch as done (192 rows / 16 = 12)
    position = state["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    if position["served"] < 12:
        assert state["epoch"] == position["epoch"]
    # the run has ended: asking it for a checkpoint is refused in one line
    assert laptrain(["checkpoint", "t", "--root", root]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is not running" in err and "last.ckpt" in err
    info = json.loads((run / "run_info.json").read_text())
    assert info["torch_threads"] == 2 and info["env_kept"] == {"OMP_NUM_THREADS": "2"}


def test_multirun_lays_out_one_readable_folder_per_job(tmp_path):
    args = [
        "-m",
        *BASE,
        *data_args(tmp_path),
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "test=false",
        "model.optimizer.lr=1e-4,3e-4",
    ]
    done = train_here(args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = sorted(p.name for p in (tmp_path / "outputs" / "multirun" / "t").iterdir() if p.is_dir())
    assert [j for j in jobs if "lr=0.0001" in j] and [j for j in jobs if "lr=0.0003" in j]
    for job in jobs:
        board = tmp_path / "outputs" / "multirun" / "t" / job / "tensorboard"
        assert list(board.glob("events.*"))
        # TensorBoard's HPARAMS tab: one row per job, its lr and best validation accuracy
        tags, params, scalars = hparams_row(board)
        assert tags == {"hp/best_val_acc"} and 0 <= scalars["hp/best_val_acc"] <= 1
        assert params["lr"] == (1e-4 if "lr=0.0001" in job else 3e-4)


def one_line_error(done: subprocess.CompletedProcess, *needles: str) -> None:
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr[-2000:]
    for needle in needles:
        assert needle in errors[0], errors[0]


def test_missing_data_file_names_the_option(tmp_path):
    done = train_here([*BASE, "data.files.train=nope.csv"], tmp_path)
    one_line_error(done, "nope.csv", "data.files.train=")


def test_missing_column_names_the_columns_and_the_option(tmp_path):
    done = train_here([*BASE, *data_args(tmp_path), "data.text_column=body"], tmp_path)
    one_line_error(done, "'body'", "columns: text, label", "data.text_column=")


def test_batch_size_zero_names_the_option(tmp_path):
    done = train_here([*BASE, *data_args(tmp_path), "hardware.batch_size=0"], tmp_path)
    one_line_error(done, "hardware.batch_size")


def test_unknown_hardware_option_lists_the_profiles(tmp_path):
    done = train_here([*BASE[1:], *data_args(tmp_path), "hardware=m9_ultra"], tmp_path)
    assert done.returncode == 2
    assert "no hardware=m9_ultra: choose one of" in done.stderr and "m2_air" in done.stderr


def test_trm_trains_through_train_py_on_a_profile_with_batch_size_auto(tmp_path):
    # the profile's batch_size auto must not touch TRM, whose batch is its carry size (data config)
    args = [
        "model=trm_sudoku",
        "data=sudoku",
        "hardware=macbook_cpu_32gb",
        "run_name=trm",
        "trainer.max_steps=3",
        "data.train_size=200",
        "data.val_size=50",
        "data.test_size=50",
        "data.batch_size=16",
    ]
    done = train_here(args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert ckpt_step(tmp_path / "outputs" / "trm" / "checkpoints" / "last.ckpt") == 3
    assert "micro batch size: 16 (data.batch_size)" in done.stdout
    assert "memory: not estimated" in done.stdout


def ranks_examples(folder: Path, stage: str) -> list[list[int]]:
    """Per rank, the dataset indices it ran in ``stage`` (tests/rank_record.py), after checking
    that every batch held the examples its sampler named (their lengths)."""
    ranks = []
    for path in sorted(folder.glob("rank*.json")):
        record = json.loads(path.read_text())
        assert all(b["lengths"] == b["expected_lengths"] for b in record[stage]), path
        ranks.append([i for b in record[stage] for i in b["ids"]])
    return ranks


def test_ddp_subprocess_ranks_split_every_batch_then_resume_and_test_without_hanging(tmp_path):
    """`trainer.strategy=ddp`: Lightning re-runs train.py for rank 1, as GPU users get it. Two
    processes at 16 end where one process at 32 ends (the README's "DDP equals one process")."""
    record = tmp_path / "record"
    job = [*BASE, *data_args(tmp_path), *NO_DROPOUT]
    args = [*job, "trainer=ddp_cpu", "trainer.strategy=ddp"]
    recorder = [
        "+callbacks.record._target_=tests.rank_record.RecordExamples",
        f"+callbacks.record.folder={record}",
        # `laptrain checkpoint` during step 3: rank 0 alone sees the file; both ranks must save
        # at the same step (else one waits in the save's barrier for ever)
        "+callbacks.request._target_=tests.signal_at.RequestAt",
        "+callbacks.request.step=3",
        f"+callbacks.request.run_dir={tmp_path / 'outputs' / 't'}",
        "callbacks.graceful_stop.check_every_s=0",
    ]
    done = run_train([*args, *recorder, "trainer.max_steps=6", "test=false"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checkpoint on request: saved step 3" in done.stdout + done.stderr
    answer = json.loads((tmp_path / "outputs" / "t" / "checkpoint_now.done").read_text())
    assert answer["step"] == 3
    assert "effective batch size: 32" in done.stdout  # 16 per process x 2 processes
    last = tmp_path / "outputs" / "t" / "checkpoints" / "last.ckpt"
    assert ckpt_step(last) == 6  # 192 rows / 32 = 6 steps: one epoch
    # one epoch: the ranks' training examples are disjoint and together the whole split (192
    # rows); the same for validation (24 rows)
    for stage, rows in (("train", 192), ("val", 24)):
        first, second = ranks_examples(record, stage)
        assert len(first) == len(second) == rows // 2, stage
        assert sorted(first + second) == list(range(rows)), stage
    one_job = [a for a in job if not a.startswith("run_name=")]
    one = train_here(
        [*one_job, "run_name=one", "hardware.batch_size=32", "trainer.max_steps=6", "test=false"],
        tmp_path,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    two_w = torch.load(last, map_location="cpu", weights_only=True)["state_dict"]
    one_last = tmp_path / "outputs" / "one" / "checkpoints" / "last.ckpt"
    one_w = torch.load(one_last, map_location="cpu", weights_only=True)["state_dict"]
    assert one_w.keys() == two_w.keys()
    worst = max((one_w[k].double() - two_w[k].double()).abs().max().item() for k in one_w)
    assert worst < 1e-5, worst  # the slow test_scale_out_runs case measures the same bound

    # the same command, a larger budget: both processes resume, then test on the best checkpoint
    # (each rank its share of the test split) and write metrics.json
    resumed = run_train([*args, "trainer.max_steps=8"], tmp_path, timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout and "global step 6," in resumed.stdout
    assert ckpt_step(last) == 8
    metrics = json.loads((tmp_path / "outputs" / "t" / "metrics.json").read_text())
    assert "test/acc" in metrics and "hp/test_acc" in metrics
    assert "Using `DistributedSampler`" not in resumed.stdout + resumed.stderr


def plain(seen: bytearray) -> str:
    """The terminal's text without Rich's colour codes and with its wrapped lines joined."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", bytes(seen).decode(errors="replace"))
    return " ".join(text.replace("\r", "\n").split())


def read_terminal(fd: int, until: str, seconds: float, seen: bytearray) -> bool:
    """Read the terminal's output into ``seen`` until ``until`` shows (True) or time runs out."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if until in plain(seen):
            return True
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            seen += chunk
    return until in plain(seen)


@pytest.mark.slow  # ~15 s
def test_in_a_terminal_ctrl_c_saves_asks_and_y_stops_with_the_resume_hint(tmp_path):
    """What a user at a terminal sees, through a pseudo-terminal: Ctrl-C typed there (the line
    discipline sends SIGINT to the foreground job), the question under the progress bar, "y"."""
    args = [*BASE, *data_args(tmp_path), "trainer.max_steps=100000", "trainer.max_epochs=1000"]
    pid, fd = pty.fork()
    if pid == 0:  # the child: train.py in the terminal's foreground
        os.chdir(tmp_path)
        os.environ["LAPTRAIN_CACHE"] = str(tmp_path / "cache")
        os.execv(sys.executable, [sys.executable, str(TRAIN), *args, "test=false"])
    seen = bytearray()
    try:
        assert read_terminal(fd, "Epoch", 120, seen), plain(seen)[-2000:]
        os.write(fd, b"\x03")
        assert read_terminal(fd, "Stop now? (y/N)", 30, seen), plain(seen)[-2000:]
        os.write(fd, b"y\n")
        read_terminal(fd, "Resume with the same command", 60, seen)
        _, status = os.waitpid(pid, 0)
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    text = plain(seen)
    assert os.waitstatus_to_exitcode(status) == 130, text[-2000:]
    saved = int(text.split("Ctrl-C: saved step ")[1].split()[0])
    assert "Resume with the same command" in text
    assert ckpt_step(tmp_path / "outputs" / "t" / "checkpoints" / "last.ckpt") == saved
