"""`python train.py -m hparams_search=optuna` end to end: the study resumes instead of repeating,
each trial returns its best validation value, and each job's TensorBoard folder holds an HPARAMS
row with the hp/ metrics (laptrain.job.hparams). `pytest -m slow tests/test_hparams_search.py`."""

from __future__ import annotations

import json

import pytest

optuna = pytest.importorskip("optuna", reason="the [sweep] extra: pip install -e '.[sweep]'")

from tests.conftest import CONF_FIXTURES, write_texts  # noqa: E402
from tests.in_process import train_here  # noqa: E402
from tests.test_hparams import hparams_row  # noqa: E402


@pytest.mark.slow  # three train.py sweeps, ~65 s on 2 cores; test_optuna_sweeper covers the logic fast
def test_optuna_study_resumes_and_each_trial_logs_an_hparams_row(tmp_path):
    args = [
        "-m",
        "hardware=cpu",
        "hparams_search=optuna",
        "experiment=tiny_sweep",
        f"hydra.searchpath=[file://{CONF_FIXTURES}]",
        f"data.files.train={write_texts(tmp_path / 'texts.csv')}",
    ]
    first = train_here([*args, "hydra.sweeper.n_trials=2"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    sweep = tmp_path / "outputs" / "multirun" / "t"
    storage = f"sqlite:///{sweep / 'optuna.db'}"
    trials = optuna.load_study(study_name="t", storage=storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]

    jobs = sorted(p for p in sweep.iterdir() if (p / "metrics.json").is_file())
    assert len(jobs) == 2
    # each trial's value is its job's best validation accuracy (the checkpoint callback's)
    recorded = sorted(json.loads((j / "metrics.json").read_text())["hp/best_val_acc"] for j in jobs)
    assert sorted(t.value for t in trials) == recorded
    for job in jobs:
        metrics = json.loads((job / "metrics.json").read_text())
        tags, params, scalars = hparams_row(job / "tensorboard")
        assert tags == {"hp/best_val_acc", "hp/test_acc"}
        assert all(abs(scalars[k] - metrics[k]) < 1e-6 for k in tags)
        assert params["model.optimizer.lr"] == params["lr"] and 1e-4 <= params["lr"] <= 3e-3
        assert params["profile"] == "cpu" and params["seed"] == 42
        assert params["parameters"] > 0 and params["micro_batch"] in (8, 16, 32)

    # the same command again: the study is complete, no trial runs
    again = train_here([*args, "hydra.sweeper.n_trials=2"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Launching" not in again.stdout + again.stderr
    assert "2 finished trials, 0 to run" in again.stdout + again.stderr

    # one more trial: exactly one runs, numbered after the first two
    more = train_here([*args, "hydra.sweeper.n_trials=3"], tmp_path)
    assert more.returncode == 0, more.stderr[-3000:]
    log = more.stdout + more.stderr
    assert log.count("Launching 1 jobs locally") == 1 and "\t#2 : " in log
    trials = optuna.load_study(study_name="t", storage=storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3
