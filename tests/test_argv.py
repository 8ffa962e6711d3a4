"""The launcher's overrides land where Hydra's argparse accepts them, whatever flags the user typed."""

from pathlib import Path

import pytest
from hydra._internal.utils import get_args_parser

from laptrain.config.overrides import (
    INFO_CHOICES,
    OPTIONAL_VALUE_OPTIONS,
    SWITCHES,
    VALUE_OPTIONS,
    insert_overrides,
    overrides,
)
from tests.in_process import train_here

NEW = ["hardware=cpu", "hardware.torch_threads=2"]


def test_option_tables_match_hydras_parser():
    value, optional, switch = set(), {}, set()
    for action in get_args_parser()._actions:
        if not action.option_strings:
            continue
        if action.nargs == "?":
            optional.update(dict.fromkeys(action.option_strings, frozenset(action.choices)))
        elif action.nargs == 0:
            switch.update(action.option_strings)
        else:
            value.update(action.option_strings)
    assert value == VALUE_OPTIONS
    assert optional == OPTIONAL_VALUE_OPTIONS and optional["--info"] == INFO_CHOICES
    assert switch == SWITCHES


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["t.py"], ["t.py", *NEW]),
        (["t.py", "a=1", "b=2"], ["t.py", "a=1", "b=2", *NEW]),
        (
            ["t.py", "model=trm", "data=sudoku", "--cfg", "job"],
            ["t.py", "model=trm", "data=sudoku", *NEW, "--cfg", "job"],
        ),
        (["t.py", "--cfg", "job"], ["t.py", *NEW, "--cfg", "job"]),
        (["t.py", "--cfg", "job", "a=1"], ["t.py", "--cfg", "job", "a=1", *NEW]),
        (
            ["t.py", "-m", "lr=1e-4,3e-4", "--cfg", "job"],
            ["t.py", "-m", "lr=1e-4,3e-4", *NEW, "--cfg", "job"],
        ),
        (["t.py", "lr=1,2", "-m"], ["t.py", "lr=1,2", *NEW, "-m"]),
        (
            ["t.py", "--multirun", "a=1", "--resolve"],
            ["t.py", "--multirun", "a=1", *NEW, "--resolve"],
        ),
        (["t.py", "--info"], ["t.py", *NEW, "--info"]),
        (["t.py", "a=1", "--info"], ["t.py", "a=1", *NEW, "--info"]),
        (["t.py", "--info", "defaults", "a=1"], ["t.py", "--info", "defaults", "a=1", *NEW]),
        (["t.py", "--help"], ["t.py", *NEW, "--help"]),
        (["t.py", "a=1", "--hydra-help"], ["t.py", "a=1", *NEW, "--hydra-help"]),
        (
            ["t.py", "-c", "job", "-p", "hardware", "a=1"],
            ["t.py", "-c", "job", "-p", "hardware", "a=1", *NEW],
        ),
        (
            ["t.py", "--config-name", "train", "a=1", "--cfg=job"],
            ["t.py", "--config-name", "train", "a=1", *NEW, "--cfg=job"],
        ),
        (
            ["t.py", "-cn", "train", "-cp", "conf", "-cd", "extra"],
            ["t.py", *NEW, "-cn", "train", "-cp", "conf", "-cd", "extra"],
        ),
        (
            ["t.py", "--config-n", "train", "--cfg", "job"],
            ["t.py", *NEW, "--config-n", "train", "--cfg", "job"],
        ),
        (
            ["t.py", "--experimental-rerun", "x.pickle"],
            ["t.py", *NEW, "--experimental-rerun", "x.pickle"],
        ),
        (["t.py", "--shell-completion", "a=1"], ["t.py", "--shell-completion", "a=1", *NEW]),
        (
            ["t.py", "--run", "a=1", "--package", "_global_"],
            ["t.py", "--run", "a=1", *NEW, "--package", "_global_"],
        ),
    ],
)
def test_inserted_overrides_parse_with_hydras_own_parser(argv, expected):
    args = insert_overrides(argv, NEW)
    assert args == expected
    parsed = get_args_parser().parse_args(args[1:])  # raises SystemExit where Hydra would refuse
    assert parsed.overrides == overrides(args)
    assert overrides(args)[-2:] == NEW


def test_options_values_are_not_overrides():
    argv = ["t.py", "--config-name", "x=y", "-p", "a=b", "--info", "config", "c=d"]
    assert overrides(argv) == ["c=d"]


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (("model=trm_sudoku", "data=sudoku", "--cfg", "job"), "hardware=auto:"),
        (("--cfg", "job", "seed=7", "hardware.batch_size=4"), "seed: 7"),
        (
            ("model=trm_sudoku", "model.size=auto", "hardware.memory_budget_gb=8", "--cfg", "job"),
            "size: ram_8gb",
        ),
    ],
)
def test_train_py_with_flags_after_or_before_overrides_prints_the_config(tmp_path, args, expect):
    done = train_here(list(args), tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert expect in done.stdout
    assert "hardware:\n  name: " in done.stdout  # the resolved profile, not `auto`


def test_train_py_help_works_after_an_override(tmp_path):
    done = train_here(["seed=3", "--help"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Powered by Hydra" in done.stdout


def test_the_selected_model_comes_from_the_override_the_experiment_or_the_default():
    from laptrain.config.overrides import selected_option

    conf = Path(__file__).resolve().parents[1] / "conf"
    assert selected_option(["train.py", "model=scibert"], "model", conf) == "scibert"
    assert selected_option(["train.py", "experiment=trm_sudoku"], "model", conf) == "trm_sudoku"
    assert selected_option(["train.py"], "model", conf) == "tiny_classifier"


def test_a_model_yaml_names_its_own_command_line_hook(tmp_path):
    """TRM's size=auto runs through the hook its YAML names; train.py knows no model by name."""
    from laptrain.config.overrides import run_argv_hook

    conf = Path(__file__).resolve().parents[1] / "conf"
    argv = [
        "train.py",
        "experiment=trm_sudoku",
        "model.size=auto",
        "model.memory_gb=8",
        "--cfg",
        "job",
    ]
    args, lines = run_argv_hook(argv, conf)
    assert "model.size=ram_8gb" in args and args[-2:] == ["--cfg", "job"]
    assert any("chose 'ram_8gb'" in line for line in lines)
    assert run_argv_hook(["train.py", "model.size=auto"], conf) == (
        ["train.py", "model.size=auto"],
        [],
    )  # the default classifier has no hook
    assert "trm_sudoku" not in (Path(__file__).resolve().parents[1] / "train.py").read_text()
