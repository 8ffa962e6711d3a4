"""The installed ``laptrain`` command itself (pyproject's [project.scripts]: laptrain.commands.cli:main),
run as a user runs it: a process of the venv's console script. Only what stops before any training
(argument errors, --help, --version), so each costs a Python start and no torch import."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from laptrain.commands import cli
from tests.test_cli_runs import leaf_parsers

LAPTRAIN = Path(sys.executable).parent / "laptrain"  # the console script pip wrote into the venv


def laptrain(*argv: str) -> subprocess.CompletedProcess[str]:
    assert LAPTRAIN.is_file(), f"{LAPTRAIN}: install the package (pip install -e .)"
    return subprocess.run(
        [str(LAPTRAIN), *argv], capture_output=True, text=True, timeout=120, check=False
    )


def test_version_and_help_of_the_installed_command() -> None:
    done = laptrain("--version")
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        f"laptrain {version('laptrain')}\n",
        "",
    )
    done = laptrain("--help")
    assert done.returncode == 0
    for name in leaf_parsers(cli.build_parser()):
        assert name.split()[0] in done.stdout, name
    done = laptrain("bench", "--help")
    assert done.returncode == 0 and "timed steps (default: 30)" in " ".join(done.stdout.split())


def test_options_and_overrides_mix_in_any_order_through_the_installed_command() -> None:
    """Issue 40: both lines exited 2 with "unrecognized arguments". Each now gets past argparse to
    the command's own check, which refuses it before any training: that refusal is the proof."""
    done = laptrain("bench", "a=1", "--steps", "20", "b=2", "--compare", "bad")
    assert "unrecognized arguments" not in done.stderr, done.stderr
    assert done.returncode == 2 and done.stdout == ""
    assert (
        done.stderr == "error: --compare 'bad': expected key=a,b (e.g. hardware.num_workers=0,2)\n"
    )
    done = laptrain("doctor", "hardware=cpu", "--json", "model=tiny_classifier", "--record")
    assert done.returncode == 2 and "argument --record: expected one argument" in done.stderr
    done = laptrain("doctor", "hardware=cpu", "--json", "model=tiny_classifier", "colour=red")
    assert "unrecognized arguments" not in done.stderr, done.stderr
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: unknown argument 'colour=red': use hardware=<profile>")


# every command that takes Hydra overrides (train hands its whole line to train.py), with its options
MIXED = {
    "bench": (["a=1", "--steps", "20", "b=2", "--warmup", "1", "c=3"], {"steps": 20, "warmup": 1}),
    "doctor": (["hardware=cpu", "--json", "model=tiny_classifier"], {"json": True}),
    "preflight": (["model=m", "--json", "hardware=cpu"], {"json": True}),
}


@pytest.mark.parametrize("command", sorted(MIXED))
def test_every_command_that_takes_overrides_parses_them_around_its_options(command) -> None:
    leaves = leaf_parsers(cli.build_parser())
    with_overrides = {
        name for name, p in leaves.items() if any(a.dest == "overrides" for a in p._actions)
    }
    assert with_overrides - {"train"} == set(MIXED)
    argv, options = MIXED[command]
    args = cli.build_parser().parse_args([command, *argv])
    assert args.overrides == [a for a in argv if "=" in a]
    assert {k: getattr(args, k) for k in options} == options


def test_pyproject_names_only_files_that_exist_and_scripts_that_import() -> None:
    """Issue 40: pyproject.toml named tests/floors.txt and scripts/check_floors.sh, neither there."""
    import importlib
    import re

    from tests.conftest import ROOT

    text = (ROOT / "pyproject.toml").read_text()
    named = set(re.findall(r"[\w.-]+(?:/[\w.*-]+)+\.(?:py|md|txt|sh|tmpl|toml|yaml)\b", text))
    assert "docs/dependencies.md" in named
    for path in named:  # a package-data pattern may have a * in a folder too
        under = [ROOT, ROOT / "src", ROOT / "src" / "laptrain"]
        assert any(list(base.glob(path)) for base in under), path
    scripts = text.split("[project.scripts]")[1].split("\n[")[0]  # tomllib: Python 3.11+
    targets = re.findall(r'^[\w-]+ = "([\w.]+):(\w+)"$', scripts, re.M)
    assert ("laptrain.commands.cli", "main") in targets
    for module, function in targets:
        assert callable(getattr(importlib.import_module(module), function)), (module, function)
