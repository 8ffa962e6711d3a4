"""Every command that takes a run resolves it the same way (laptrain.run_folder.listing.resolve_run):
the name `laptrain runs` prints, or the folder, with `--root`; an unknown name is one line, exit 2."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from laptrain.commands import cli
from laptrain.run_folder.listing import RUNS_ROOT, resolve_run, run_names

# every command that takes a run, with the other arguments it needs to get as far as resolving it
RUN_COMMANDS = {
    "predict": ["x"],
    "why": [],
    "export": [],
    "generate": ["--prompt", "hi"],
    "eval": ["--data", "rows.jsonl"],
    "checkpoint": [],
    "runs compare": ["tiny-b"],
    "runs summary": [],
    "runs clean": [],
}


def leaf_parsers(
    parser: argparse.ArgumentParser, prefix: str = ""
) -> dict[str, argparse.ArgumentParser]:
    """``{"runs compare": parser, ...}``: every subcommand's parser that has no subcommands itself."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(leaf_parsers(sub, f"{prefix}{name} "))
    return found or {prefix.strip(): parser}


def make_runs(root: Path) -> Path:
    for name in ("tiny-a", "tiny-b", "multirun/sweep/lr=0.1"):
        (root / name / ".hydra").mkdir(parents=True)
        (root / name / "report.json").write_text(json.dumps({"run": {"status": "finished"}}))
    return root


def test_the_resolver_takes_a_name_or_a_folder_and_names_the_closest_runs(tmp_path) -> None:
    root = make_runs(tmp_path / "outputs")
    assert RUNS_ROOT == "outputs"
    assert run_names(root) == ["tiny-a", "tiny-b", "multirun/sweep/lr=0.1"]
    assert resolve_run("tiny-a", root) == root / "tiny-a"
    assert resolve_run("multirun/sweep/lr=0.1", root) == root / "multirun/sweep/lr=0.1"
    assert resolve_run(str(root / "tiny-b"), tmp_path / "elsewhere") == root / "tiny-b"
    (tmp_path / "adapter").mkdir()
    assert resolve_run(str(tmp_path / "adapter"), root, any_folder=True) == tmp_path / "adapter"
    with pytest.raises(ValueError) as err:
        resolve_run(str(tmp_path / "adapter"), root)
    assert str(err.value).startswith(f"no run folder {tmp_path / 'adapter'}: ")
    with pytest.raises(ValueError) as err:
        resolve_run("tiny_a", root)
    assert str(err.value) == (
        f"no run folder tiny_a: neither a run under {root}/ nor a path to one (closest: tiny-a, "
        f"tiny-b; `laptrain runs --root {root}` lists them)"
    )
    with pytest.raises(ValueError, match=r"there are none there yet \(`laptrain runs` lists"):
        resolve_run("x", tmp_path / "empty")


def test_every_command_that_takes_a_run_has_root_and_they_are_all_listed() -> None:
    leaves = leaf_parsers(cli.build_parser())
    takes_a_run = {
        name
        for name, parser in leaves.items()
        if any(a.dest in ("run", "runs", "path") for a in parser._actions if not a.option_strings)
    }
    assert takes_a_run == set(RUN_COMMANDS)
    for name in takes_a_run:
        assert "--root" in leaves[name]._option_string_actions, name


@pytest.mark.parametrize("command", sorted(RUN_COMMANDS))
def test_an_unknown_run_is_one_line_naming_the_closest_and_exit_2(
    command, tmp_path, capsys, monkeypatch
) -> None:
    root = make_runs(tmp_path / "outputs")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    argv = [*command.split(), "tiny_a", *RUN_COMMANDS[command], "--root", str(root)]
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith("error: no run folder tiny_a: neither a run under "), line
    assert "(closest: tiny-a, tiny-b; `laptrain runs --root " in line, line


def test_why_finds_a_run_by_the_name_runs_prints(tmp_path, capsys, monkeypatch) -> None:
    root = make_runs(tmp_path / "runs")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["why", "tiny-a", "--root", str(root)]) == 0
    assert capsys.readouterr().out.startswith(f"{root / 'tiny-a'}: finished at step ")
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "tiny-c").mkdir()
    (tmp_path / "outputs" / "tiny-c" / "report.json").write_text(json.dumps({"run": {}}))
    assert cli.main(["why", "tiny-c"]) == 0  # --root's default: outputs
    assert capsys.readouterr().out.startswith(f"{Path('outputs') / 'tiny-c'}: ")
