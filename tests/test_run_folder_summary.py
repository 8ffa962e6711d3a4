"""`laptrain runs summary`: a k-fold sweep's runs as each metric's mean ± std over the folds."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import yaml

from laptrain.commands import cli
from tests.conftest import TINY, write_texts
from tests.in_process import train_here


def fold_run(folder: Path, fold: int, lr: float, metrics: dict, best: float | None = None) -> None:
    config = {"model": {"optimizer": {"lr": lr}}, "data": {"folds": 3, "fold": fold}}
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (folder / "metrics.json").write_text(json.dumps({**metrics, "hp/test_acc": 0.0}))
    checkpoint = {"monitor": "val/acc", "best_score": best} if best is not None else {}
    (folder / "report.json").write_text(json.dumps({"checkpoint": checkpoint}))


def test_runs_that_differ_only_in_the_fold_are_one_group_of_mean_and_sample_std(tmp_path, capsys):
    sweep = tmp_path / "outputs" / "multirun" / "kf"
    accs, bests = [0.5, 0.6, 0.7], [0.4, 0.5, 0.9]
    for fold, (acc, best) in enumerate(zip(accs, bests)):
        fold_run(sweep / f"data.fold={fold},lr=0.1", fold, 0.1, {"test/acc": acc}, best)
    fold_run(sweep / "data.fold=0,lr=0.2", 0, 0.2, {"test/acc": 0.9})
    root = str(tmp_path / "outputs")
    assert cli.main(["runs", "summary", "multirun/kf", "--root", root]) == 0
    out = capsys.readouterr().out
    assert "3 runs, data.fold=0,1,2 (model.optimizer.lr=0.1)" in out
    assert "| test/acc     | 0.6 ± 0.1 " in out  # sample std (n-1) of 0.5, 0.6, 0.7
    assert "| best val/acc | 0.6 ± 0.2646 | 3 |" in out
    assert "1 runs, data.fold=0 (model.optimizer.lr=0.2)" in out and "0.9 ± —" in out
    assert "hp/" not in out

    assert cli.main(["runs", "summary", str(sweep), "--json"]) == 0
    groups = json.loads(capsys.readouterr().out)["groups"]
    assert [g["folds"] for g in groups] == [[0, 1, 2], [0]]
    acc = groups[0]["metrics"]["test/acc"]
    assert acc["n"] == 3 and abs(acc["std"] - statistics.stdev(accs)) < 1e-12
    assert groups[1]["metrics"]["test/acc"] == {"mean": 0.9, "std": None, "n": 1}


def test_a_three_fold_sweep_trains_each_fold_and_summarises(tmp_path, capsys):
    """`python train.py -m data=text_csv data.folds=3 data.fold=0,1,2`, then `runs summary`."""
    args = [
        "-m",
        "hardware=cpu",
        "model=tiny_classifier",
        "data=text_csv",
        *TINY,
        f"data.files.train={write_texts(tmp_path / 'texts.csv')}",
        "data.folds=3",
        "data.fold=0,1,2",
        "debug=fast",
        "trainer.val_check_interval=3",
        "run_name=kf",
    ]
    done = train_here(args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    sweep = tmp_path / "outputs" / "multirun" / "kf"
    assert len([p for p in sweep.iterdir() if (p / "metrics.json").is_file()]) == 3
    capsys.readouterr()
    assert cli.main(["runs", "summary", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("3 runs, data.fold=0,1,2\n"), out
    for metric in ("best val/acc", "test/acc", "test/loss", "train/loss"):
        [row] = [line for line in out.splitlines() if line.startswith(f"| {metric} ")]
        assert " ± " in row and row.rstrip().endswith("| 3 |"), row
