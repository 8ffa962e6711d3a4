"""laptrain.run_folder.listing: each run folder's status, step, best score and the command that resumes it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch
import yaml

from laptrain.run_folder.listing import find_runs, resume_command, run_state, runs_table

DEFAULT_NAME = "${hydra:runtime.choices.model}-${hydra:runtime.choices.data}"


def make_run(
    folder: Path,
    overrides: list[str],
    status: str | None = "finished",
    step: int = 12,
    mode: str = "RUN",
    run_name: str = DEFAULT_NAME,
) -> Path:
    """A run folder as train.py leaves it: .hydra/, a report (unless ``status`` is None)."""
    hydra = folder / ".hydra"
    hydra.mkdir(parents=True)
    (hydra / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (hydra / "config.yaml").write_text(yaml.safe_dump({"run_name": run_name}))
    choices = {"model": "tiny_classifier", "data": "text_csv"}
    (hydra / "hydra.yaml").write_text(
        yaml.safe_dump({"hydra": {"mode": mode, "runtime": {"choices": choices}}})
    )
    if status is not None:
        report = {
            "run": {"status": status, "global_step": step},
            "checkpoint": {"monitor": "val/acc", "best_score": 0.625},
        }
        (folder / "report.json").write_text(json.dumps(report))
    return folder


def test_the_resume_command_is_the_run_s_own_overrides(tmp_path):
    run = make_run(
        tmp_path / "tiny_classifier-text_csv", ["data=text_csv", "data.files.train=a b.csv"]
    )
    assert resume_command(run) == "python train.py data=text_csv 'data.files.train=a b.csv'"


def test_a_resume_false_run_is_resumed_by_its_folder_name(tmp_path):
    # resume=false put it in <name>-2; the plain rerun would resume <name> instead
    run = make_run(tmp_path / "tiny_classifier-text_csv-2", ["resume=false", "trainer.max_steps=5"])
    assert resume_command(run) == (
        "python train.py trainer.max_steps=5 run_name=tiny_classifier-text_csv-2"
    )
    named = make_run(tmp_path / "mine", ["run_name=mine", "ckpt_path=/x/best.ckpt"])
    assert resume_command(named) == "python train.py run_name=mine"  # ckpt_path would restart


def test_a_sweep_job_is_resumed_by_its_sweep(tmp_path):
    job = make_run(
        tmp_path / "multirun" / "t" / "model.optimizer.lr=0.1",
        ["run_name=t", "model.optimizer.lr=0.1"],
        mode="MULTIRUN",
    )
    assert resume_command(job) == "python train.py -m model.optimizer.lr=0.1 run_name=t"


def test_states_read_from_reports_and_checkpoints(tmp_path):
    outputs = tmp_path / "outputs"
    make_run(outputs / "tiny_classifier-text_csv", [])
    make_run(
        outputs / "paused", ["run_name=paused"], "stopped (session); resume with the same command"
    )
    killed = make_run(outputs / "killed", ["run_name=killed"], status=None)
    (killed / "checkpoints").mkdir()
    monitor_key = "ModelCheckpoint{'monitor': 'val/acc', 'mode': 'max'}"
    torch.save(
        {"global_step": 7, "callbacks": {monitor_key: {"best_model_score": torch.tensor(0.25)}}},
        killed / "checkpoints" / "last.ckpt",
    )
    make_run(outputs / "multirun" / "s" / "lr=1", ["run_name=s", "lr=1"], mode="MULTIRUN")
    (outputs / "notes").mkdir()  # not a run
    runs = find_runs(outputs)
    assert [r.relative_to(outputs).as_posix() for r in runs] == [
        "killed",
        "paused",
        "tiny_classifier-text_csv",
        "multirun/s/lr=1",
    ]
    states = {r.name: run_state(r) for r in runs}
    assert (states["killed"].status, states["killed"].step, states["killed"].best) == (
        "interrupted",
        7,
        "val/acc 0.25",
    )
    assert states["paused"].status == "paused"
    done = states["tiny_classifier-text_csv"]
    assert (done.status, done.step, done.best, done.command) == (
        "done",
        12,
        "val/acc 0.625",
        "python train.py",
    )
    table = runs_table(list(states.values()), outputs).splitlines()
    assert table[0].split()[:4] == ["run", "status", "step", "best"] and len(table) == 5
    assert any(line.startswith("multirun/s/lr=1 ") for line in table)


def test_a_run_held_by_a_live_process_is_running(tmp_path):
    run = make_run(tmp_path / "busy", ["run_name=busy"], "interrupted (SIGINT)")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                from laptrain.run_folder.lock import hold_run_folder
                import sys, time
                hold_run_folder({str(run)!r}); print("held", flush=True); time.sleep(30)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run_state(run).status == "running"
    finally:
        holder.kill()
        holder.wait()
    assert run_state(run).status == "interrupted"


def test_listing_finished_runs_does_not_import_torch(tmp_path):
    make_run(tmp_path / "outputs" / "tiny_classifier-text_csv", [])
    code = (
        "import sys; from laptrain.run_folder.listing import find_runs, run_state, runs_table; "
        f"print(runs_table([run_state(f) for f in find_runs({str(tmp_path / 'outputs')!r})], "
        f"__import__('pathlib').Path({str(tmp_path / 'outputs')!r}))); "
        "print('torch' in sys.modules)"
    )
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "False" and "val/acc 0.625" in done.stdout
    assert time.monotonic() - start < 10
