"""README claims that had no end-to-end check in the fast suite: the default job's accuracy, and
``hardware.batch_size=auto`` (every Apple profile's setting) through ``train.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY, write_texts
from tests.in_process import train_here

DEFAULT_RUN = ROOT / "outputs" / "tiny_classifier-stdlib_docstrings"
# Measured 62.4-64.8 % test accuracy in the runs docs/benchmarks.md lists (chance 12.5 %, the
# majority class 27 %): a floor well under them and far over the majority class.
DEFAULT_JOB_FLOOR = 0.50
# debug=fast (6 steps, 2 validation and test batches), validated at steps 3 and 6
FEW_STEPS = ["debug=fast", "trainer.val_check_interval=3"]


def _fresh(metrics: Path) -> bool:
    """Whether ``metrics`` was written after the last change to the code and configs it ran."""
    if not metrics.is_file():
        return False
    newest = max(p.stat().st_mtime for d in ("src", "conf") for p in (ROOT / d).rglob("*.*"))
    return metrics.stat().st_mtime > max(newest, (ROOT / "train.py").stat().st_mtime)


def default_job_cache() -> str:
    """The cache the README's `python train.py` uses: the stdlib corpus is built once there."""
    return os.environ.get("LAPTRAIN_CACHE", str(Path.home() / ".cache" / "laptrain"))


@pytest.mark.slow  # ~60 s; fast twin: test_the_default_job_trains_tests_and_writes_its_metrics
def test_the_default_job_reaches_its_accuracy(tmp_path):
    """`python train.py` as the README's set-up line runs it. CI (`.ci/run`) has just run it in
    the clone, and that run is read; without a fresh one the job runs here (about 40 s)."""
    metrics = DEFAULT_RUN / "metrics.json"
    if not _fresh(metrics):
        done = train_here([], tmp_path, env={"LAPTRAIN_CACHE": default_job_cache()})
        assert done.returncode == 0, done.stderr[-3000:]
        assert "test: acc" in done.stdout
        metrics = tmp_path / "outputs" / DEFAULT_RUN.name / "metrics.json"
    values = json.loads(metrics.read_text())
    assert values["test/acc"] >= DEFAULT_JOB_FLOOR, values
    assert values["val/acc"] >= DEFAULT_JOB_FLOOR, values


def test_the_default_job_trains_tests_and_writes_its_metrics(tmp_path):
    """The default job's plumbing at a few steps (its accuracy is the slow test above): the same
    groups, data and folder as `python train.py`, through validation and the test stage."""
    done = train_here(FEW_STEPS, tmp_path, env={"LAPTRAIN_CACHE": default_job_cache()})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done at global step 6" in done.stdout and "test: acc" in done.stdout
    values = json.loads((tmp_path / "outputs" / DEFAULT_RUN.name / "metrics.json").read_text())
    assert 0 <= values["test/acc"] <= 1 and 0 <= values["val/acc"] <= 1, values


def test_an_auto_batch_is_picked_by_the_preflight_and_trains(tmp_path):
    args = [
        "hardware=cpu",
        "hardware.batch_size=auto",
        "hardware.memory_budget_gb=4",
        "model=tiny_classifier",
        "data=text_csv",
        *TINY,
        f"data.files.train={write_texts(tmp_path / 'texts.csv')}",
        "trainer.max_steps=2",
        "test=false",
        "run_name=auto",
    ]
    done = train_here(args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("micro batch size: "))
    picked = int(line.split()[3])
    assert picked >= 1 and "batch_size auto: the largest that fits" in line, line
    assert "done at global step 2" in done.stdout
    plan = json.loads((tmp_path / "outputs" / "auto" / "run_info.json").read_text())["plan"]
    assert plan["micro_batch"] == plan["loader_batch"] == picked, plan
    assert plan["memory"]["estimate_gb"] <= plan["memory"]["budget_gb"] == 4.0, plan["memory"]
    assert f"at micro batch {picked} x" in plan["memory"]["lines"][0]
