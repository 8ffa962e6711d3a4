"""Runs on 2 processes through `train.py` with `trainer.strategy=ddp` (Lightning re-runs the
command for rank 1, the path GPU users take): each family's final weights equal those of a
1-process run with the same global batch, so the ranks share the data and the gradients right."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import (
    NO_DROPOUT,
    TINY,
    TINY_LORA,
    TRAIN,
    run_train,
    tiny_classifier_job,
    write_texts,
)

DDP = ["trainer=ddp_cpu", "trainer.strategy=ddp"]
# the tiny LoRA job without dropout on the pairs of ten stdlib modules: 1 and 2 processes compare
LORA_ON_TEN_MODULES = [
    *TINY_LORA,
    "model.lora.dropout=0",
    "data.builder.modules=[json,csv,base64,shlex,heapq,bisect,textwrap,fnmatch,glob,copy]",
    "data.vocab_size=512",
    "data.max_length=64",
]


def final_weights(tmp_path: Path, run: str) -> dict[str, torch.Tensor]:
    path = tmp_path / "outputs" / run / "checkpoints" / "last.ckpt"
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(
        (a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].is_floating_point()
    )


def train_both(
    tmp_path: Path, common: list[str], one: list[str], two: list[str], export: str | None = None
) -> dict[str, float]:
    """The same job on 1 process and on 2 (runs ``one`` and ``two``), one after the other; each
    fits, validates and tests on its best checkpoint (on every rank) and writes metrics.json and
    its ``export`` folder. Returns the 2-process run's metrics."""
    for run, extra in (("one", one), ("two", [*two, *DDP])):
        done = run_train([*common, *extra, f"run_name={run}"], tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    folder = tmp_path / "outputs" / "two"
    if export:
        assert (folder / export).is_dir()
    return json.loads((folder / "metrics.json").read_text())


@pytest.mark.slow  # ~22 s; test_train_e2e keeps a 2-process run in the fast suite
def test_trm_on_two_ranks_trains_like_one_rank_with_the_global_batch(tmp_path):
    """TRM optimizes manually; before, a rank never back-propagated under DDP (weights frozen)."""
    record = tmp_path / "record"
    common = [
        "model=trm_sudoku",
        "data=sudoku",
        "hardware=cpu",
        "trainer.max_steps=3",
        "data.train_size=200",
        "data.val_size=50",
        "data.test_size=50",
        "+callbacks.start._target_=tests.rank_record.RecordStartWeights",
        f"+callbacks.start.folder={record}",
    ]
    metrics = train_both(tmp_path, common, ["data.batch_size=16"], ["data.batch_size=8"])
    assert "test/exact_acc" in metrics
    one, two = final_weights(tmp_path, "one"), final_weights(tmp_path, "two")
    start = torch.load(record / "start.pt", weights_only=True)
    assert largest_difference(start, two) > 1e-5  # 3 warm-up steps moved them by 1.05e-4
    assert largest_difference(one, two) < 1e-6  # measured 3.7e-8


@pytest.mark.slow  # ~35 s
def test_lora_on_two_ranks_trains_like_one_rank_with_the_global_batch(tmp_path):
    """Response tokens differ between the ranks' halves: the loss is normalised by the tokens of
    the whole step on all ranks, under accumulation too."""
    common = [
        *LORA_ON_TEN_MODULES,
        "trainer.max_steps=3",
        "trainer.accumulate_grad_batches=2",
        "trainer.val_check_interval=6",
    ]
    metrics = train_both(tmp_path, common, ["data.batch_size=8"], ["data.batch_size=4"], "adapter")
    assert "test/loss" in metrics
    one, two = final_weights(tmp_path, "one"), final_weights(tmp_path, "two")
    assert largest_difference(one, two) < 1e-6


@pytest.mark.slow  # ~30 s
def test_classifier_on_two_ranks_trains_like_one_rank_with_the_global_batch(tmp_path):
    common = [
        *tiny_classifier_job(tmp_path),
        *NO_DROPOUT,
        "trainer.max_steps=6",
    ]
    metrics = train_both(
        tmp_path, common, ["hardware.batch_size=32"], ["hardware.batch_size=16"], "model"
    )
    assert "test/acc" in metrics
    one, two = final_weights(tmp_path, "one"), final_weights(tmp_path, "two")
    assert largest_difference(one, two) < 1e-5


@pytest.mark.slow  # ~50 s: three runs on 2 processes
def test_sigterm_to_rank_0_only_stops_both_ranks_at_one_step_and_the_rerun_ends_exactly(tmp_path):
    """Rank 1 never sees the signal: the stop is agreed at the batch end (one all-reduce), both
    ranks save one checkpoint at that step and exit 143, and the rerun restores each rank's own
    random generators, so dropout after the resume matches an uninterrupted run."""
    texts = write_texts(tmp_path / "texts.csv")
    common = [
        "hardware=cpu",
        "model=tiny_classifier",
        "data=text_csv",
        *TINY,
        f"data.files.train={texts}",
        "trainer.max_steps=12",
        "test=false",
        *DDP,
    ]
    stop_rerun_and_compare(tmp_path, common)


def stop_rerun_and_compare(tmp_path: Path, common: list[str]) -> None:
    """Run ``common`` whole (run ``whole``), then with SIGTERM to rank 0 at step 3 (run ``cut``:
    exit 143, ``last.ckpt`` at step 3), then rerun ``cut``: it resumes from step 3 and ends with
    the same weights as ``whole``, exactly."""
    whole = run_train([*common, "run_name=whole"], tmp_path, timeout=300)
    assert whole.returncode == 0, whole.stderr[-3000:]
    signal_at = [
        "+callbacks.signal._target_=tests.rank_record.SignalAt",
        "+callbacks.signal.step=3",
    ]
    stopped = run_train([*common, *signal_at, "run_name=cut"], tmp_path, timeout=300)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    last = tmp_path / "outputs" / "cut" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 3
    rerun = run_train([*common, "run_name=cut"], tmp_path, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "global step 3," in rerun.stdout
    assert largest_difference(final_weights(tmp_path, "whole"), final_weights(tmp_path, "cut")) == 0


@pytest.mark.slow  # ~25 s
def test_ddp_spawn_run_tests_on_both_processes_and_reports_its_step_and_best_score(tmp_path):
    """`trainer=ddp_cpu` (ddp_spawn, what `-m` sweeps use on one machine): the main process's
    Trainer gets back only the best checkpoint's path, yet the closing lines name the real step
    and score (they said step 0 and nan)."""
    args = [
        "hardware=cpu",
        "model=tiny_classifier",
        "data=text_csv",
        *TINY,
        f"data.files.train={write_texts(tmp_path / 'texts.csv')}",
        "trainer=ddp_cpu",
        "trainer.max_steps=6",
        "run_name=spawn",
    ]
    done = run_train(args, tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done at global step 6" in done.stdout
    best = next(line for line in done.stdout.splitlines() if line.startswith("best checkpoint"))
    assert "nan" not in best and "(val/acc " in best
    assert "test/acc" in json.loads((tmp_path / "outputs" / "spawn" / "metrics.json").read_text())


@pytest.mark.slow  # ~30 s
def test_torchrun_starts_both_ranks_and_they_agree_on_an_auto_base_dtype(tmp_path):
    """torchrun starts every rank at once, each composing and building on its own: with
    ``model.base_dtype=auto`` each decides on its device's total memory, the ranks compare their
    choices once the process group is up, and the job trains, tests and exports."""
    record = tmp_path / "record"
    args = [
        *TINY_LORA,
        "model.base_dtype=auto",
        "data.builder.modules=[json,csv,base64,shlex]",
        "data.vocab_size=512",
        "data.max_length=64",
        "data.batch_size=4",
        "trainer.max_steps=2",
        *DDP,
        "run_name=torchrun",
        "+callbacks.dtypes._target_=tests.rank_record.RecordFrozenDtypes",
        f"+callbacks.dtypes.folder={record}",
    ]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*launcher, str(TRAIN), *args],
        cwd=tmp_path,
        env={**os.environ, "LAPTRAIN_CACHE": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    # each rank decided on its own (torchrun starts them together) and both hold the same dtype
    held = [json.loads(p.read_text()) for p in sorted(record.glob("rank*-dtypes.json"))]
    assert len(held) == 2 and held[0] == held[1] and held[0], held
    folder = tmp_path / "outputs" / "torchrun"
    assert "test/loss" in json.loads((folder / "metrics.json").read_text())
    assert (folder / "adapter").is_dir()
    assert final_weights(tmp_path, "torchrun")
