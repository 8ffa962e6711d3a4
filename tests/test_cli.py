"""The laptrain console script: its subcommand map, `laptrain train` as `python train.py`, and a
run's console output, `laptrain runs` and `laptrain predict` on that run."""

from __future__ import annotations

import argparse
import os
import re
import sys

import pytest

from laptrain.commands import cli
from tests.conftest import ROOT, TINY, write_texts
from tests.forked_train import run_python


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_subcommand_maps_to_a_function_and_every_function_to_a_subcommand():
    parsers = subcommands(cli.build_parser())
    commands = cli.command_table(cli.family_commands())
    assert set(parsers) == set(commands)
    assert {"train", "predict", "runs", "doctor"} <= set(parsers)
    assert all(callable(f) for f in commands.values())
    for name, sub in parsers.items():
        if name != "train":  # train's --help is Hydra's, printed by train.py
            with pytest.raises(SystemExit) as done:
                sub.parse_args(["--help"])
            assert done.value.code == 0, name


def test_laptrain_train_hands_train_py_its_arguments_untouched(monkeypatch):
    seen = {}

    def run_path(path, run_name):
        seen.update(path=path, run_name=run_name, argv=list(sys.argv))

    monkeypatch.setattr(sys, "argv", ["laptrain"])
    monkeypatch.setattr(cli.runpy, "run_path", run_path)
    args = ["-m", "model=tiny_classifier", "--cfg", "job", "--help"]
    assert cli.main(["train", *args]) == 0
    assert seen["path"] == str(ROOT / "train.py") and seen["run_name"] == "__main__"
    assert seen["argv"] == [str(ROOT / "train.py"), *args]


def test_a_run_prints_a_short_true_console_then_runs_and_predict_read_it(tmp_path, capsys):
    """Acceptance: the lines above the bar fit a screen, no warnings, one closing block."""
    args = [
        "hardware=cpu",
        "model=tiny_classifier",
        "data=text_csv",
        "run_name=t",
        *TINY,
        f"data.files.train={write_texts(tmp_path / 'texts.csv')}",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
    ]
    env = {**os.environ, "LAPTRAIN_CACHE": str(tmp_path / "cache")}
    done = run_python(["-m", "laptrain.commands.cli", "train", *args], tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ""  # no warnings, no library bars
    lines = done.stdout.splitlines()
    above = lines[: next(i for i, line in enumerate(lines) if line.startswith("Epoch 1/3"))]
    assert len(above) <= 20, above
    assert any(line.startswith("model: BertForSequenceClassification, ") for line in above)
    for noise in ("GPU available", "Tip:", "FLOPs", "LeafSpec", "fontManager", "report:", "config"):
        assert noise not in done.stdout, noise
    closing = lines[lines.index("done at global step 4") :]
    assert re.fullmatch(r"test: acc [\d.]+ · f1 [\d.]+ · loss [\d.]+", closing[1])
    assert closing[-2].startswith("best checkpoint: outputs/t/checkpoints/best-step")
    assert closing[-1] == "run folder: outputs/t (report.md)"
    assert not [line for line in closing if "lr-" in line]

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.chdir(tmp_path)
    try:
        capsys.readouterr()
        assert cli.main(["runs"]) == 0
        table = capsys.readouterr().out.splitlines()
        assert table[1].split()[:3] == ["t", "done", "4"], table
        kept = [a for a in args if a != "run_name=t"]
        assert table[1].endswith(" python train.py " + " ".join([*kept, "run_name=t"]))
        assert cli.main(["predict", "outputs/t", "the team won the match", "bake the bread"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert len(out) == 2
        label, probability, text = out[0].split("\t")
        assert label in {"cooking", "sports", "weather"} and 0.33 <= float(probability) <= 1
        assert text == "the team won the match"
        assert cli.main(["predict", "outputs/nothing", "x"]) == 2
        assert capsys.readouterr().err.startswith("error: no run folder outputs/nothing")
    finally:
        monkeypatch.undo()
