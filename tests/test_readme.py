"""Every `python train.py ...` line in README.md works as written: recipes compose (hardware=auto
and model.size=auto resolved as train.py resolves them, every job of a sweep) and bind to their
constructors; the data files they name are checked where a stand-in can be made; the `error:` lines
the README shows are the ones the checks print."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
from pathlib import Path

import pytest

from laptrain.config.check import check_composed, compose_argv
from laptrain.data.precheck import check_data_config
from laptrain.launch.prepare import resolve_argv
from tests.conftest import CONF, ROOT, write_texts

README = (ROOT / "README.md").read_text()
DATA_TARGET = "laptrain.families.classifier.text_classification.TextClassificationDataModule"
INSTRUCTIONS_TARGET = "laptrain.families.lora.instructions.InstructionDataModule"
PREFERENCES_TARGET = "laptrain.families.lora.preferences.PreferenceDataModule"


def _expand(line: str) -> list[str]:
    """The argv a shell gives for ``line``, from the repository root (``$PWD``) and ``$HOME``."""
    words = shlex.split(line, comments=True)
    return [os.path.expandvars(w.replace("$PWD", str(ROOT))) for w in words]


def readme_commands() -> tuple[list[str], list[tuple[str, str]]]:
    """(recipe lines, (failing line, its documented error)) of README.md: lines of code blocks
    starting with ``python train.py`` (or ``$ python train.py`` followed by an ``error:`` line)
    and inline code spans holding one."""
    recipes, failing = [], []
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", README, re.DOTALL | re.MULTILINE)
    for block in blocks:
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("python train.py"):
                recipes.append(line)
            elif line.startswith("$ python train.py"):
                failing.append((line[2:], lines[i + 1]))
    prose = re.sub(r"^```.*?^```", "", README, flags=re.DOTALL | re.MULTILINE)
    recipes += re.findall(r"`(python train\.py[^`]*)`", prose)
    unique = {shlex.join(shlex.split(r, comments=True)): None for r in recipes}
    return list(unique), failing


RECIPES, FAILING = readme_commands()


def _jobs(argv: list[str]) -> list[list[str]]:
    """One argv per job: a ``-m`` sweep's overrides expanded as Hydra's basic sweeper does."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if "-m" not in argv and "--multirun" not in argv:
        return [argv]
    parser = OverridesParser.create()
    rest = [a for a in argv if a not in ("-m", "--multirun")]
    choices = []
    for arg in rest[1:]:
        parsed = parser.parse_override(arg) if "=" in arg else None
        if parsed is not None and parsed.is_sweep_override():
            key = parsed.get_key_element()
            choices.append([f"{key}={v}" for v in parsed.sweep_string_iterator()])
        else:
            choices.append([arg])
    return [[rest[0], *job] for job in itertools.product(*choices)]


# README data files that are not in this repository: a stand-in with the columns the command names
# is written and checked by train.py's data check. The Sudoku-Extreme folder is only composed: it is
# read when the run builds its datamodule.
STAND_INS = {"reviews.csv": ("review", "stars"), "papers.jsonl": ("text", "label")}


def write_stand_in(path: Path, target: str) -> None:
    if target == PREFERENCES_TARGET:
        rows = [
            {"prompt": f"What is {i} + 1?", "chosen": f"{i + 1}.", "rejected": f"{i + 2}."}
            for i in range(30)
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return
    if target == INSTRUCTIONS_TARGET:
        rows = [{"prompt": f"What is {i} + 1?", "response": f"{i + 1}."} for i in range(30)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return
    text, label = STAND_INS.get(path.name, ("text", "label"))
    write_texts(path, rows=60, fmt=path.suffix[1:])
    if (text, label) != ("text", "label"):
        path.write_text(path.read_text().replace("text,label", f"{text},{label}", 1))


def test_the_readme_has_the_recipes_this_test_reads():
    assert len(RECIPES) >= 15 and len(FAILING) >= 4
    assert any("data.files.validation=" in r for r in RECIPES)
    assert any(" -m " in r for r in RECIPES)


@pytest.mark.parametrize("line", RECIPES)
def test_every_readme_recipe_composes_as_written(line, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # relative data files resolve here, where stand-ins are written
    monkeypatch.setenv("LAPTRAIN_CACHE", str(tmp_path / "cache"))
    argv = resolve_argv(_expand(line)[1:], CONF)
    for job in _jobs(argv):
        cfg = compose_argv(job, str(CONF))
        check_composed(cfg)
        files = cfg.data.get("files") or {}
        target = cfg.data.get("_target_")
        readers = (DATA_TARGET, INSTRUCTIONS_TARGET, PREFERENCES_TARGET)
        checked = target in readers and any(files.values())
        for name in [f for f in files.values() if f] if checked else []:
            write_stand_in(tmp_path / name, target)
        check_data_config(cfg.data)
        if checked:  # read, not skipped
            assert list((tmp_path / "cache" / "checked").iterdir()), line


@pytest.mark.parametrize(("line", "error"), FAILING)
def test_every_readme_error_line_is_what_the_checks_print(line, error):
    from laptrain.launch.device import check_device

    argv = _expand(line)[1:]
    with pytest.raises(ValueError) as raised:  # ConfigError and ProfileError are ValueErrors
        cfg = compose_argv(argv, str(CONF))
        check_composed(cfg)
        check_device(cfg)
    printed = f"error: {raised.value}"
    parts = [p.strip() for p in error.split("...")]  # the README shortens long lists with ...
    at = 0
    for part in parts:
        found = printed.find(part, at)
        assert found >= 0, (part, printed)
        at = found + len(part)


def _section(title: str) -> str:
    found = re.search(
        rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.DOTALL | re.MULTILINE
    )
    assert found, f"README.md has no '## {title}' section"
    return found.group(1)


def two_commands() -> dict[str, list[str]]:
    """The command lines of the README's "## Two commands" bash blocks: set-up, then tests."""
    section = _section("Two commands")
    blocks = re.findall(r"^```bash\n(.*?)^```", section, re.DOTALL | re.MULTILINE)
    assert len(blocks) == 2, f"'## Two commands' has {len(blocks)} bash blocks, not 2"
    return dict(zip(("setup", "test"), (b.strip().splitlines() for b in blocks), strict=True))


def test_ci_runs_the_readme_commands_line_for_line_and_nothing_else():
    """.ci/run is the README's two blocks as written: a command of its own (an install or a test
    line) would let CI and the README drift apart again."""
    lines = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    commands = two_commands()
    assert lines == [
        "set -euo pipefail",
        'cd "$(dirname "$0")/.."',
        *commands["setup"],
        *commands["test"],
    ]


def test_the_readme_commands_are_the_ones_a_newcomer_sees():
    commands = two_commands()
    assert commands["setup"][0] == "python -m venv .venv && . .venv/bin/activate"
    assert commands["setup"][1].startswith('pip install torch==2.13.0 && pip install -e ".[dev]"')
    assert commands["setup"][2] == "python train.py"
    assert commands["test"] == ["python -m pytest -q"]


def test_the_dev_extra_installs_every_extra_the_suite_tests():
    from tests.test_dependencies import PROJECT

    extras = PROJECT["optional-dependencies"]
    assert (
        "laptrain[sweep]" in extras["dev"]
    )  # the optuna sweeper and the slurm launcher are tested


def test_dated_measurements_stay_in_the_status_section():
    """The README is a guide: a dated figure belongs in docs/benchmarks.md, and only the "Status
    and numbers" table dates the one current figure per claim."""
    status = _section("Status and numbers")
    rest = README.replace(status, "")
    dated = [line for line in rest.splitlines() if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert dated == [], dated


def test_the_status_table_keeps_to_eight_claims_with_dates():
    rows = [
        line
        for line in _section("Status and numbers").splitlines()
        if line.startswith("| ") and not line.startswith("| claim")
    ]
    assert 1 <= len(rows) <= 8
    assert all(re.search(r"\| 20\d\d-\d\d-\d\d \|$", row) for row in rows), rows


def test_every_status_figure_names_the_command_that_reproduces_it():
    rows = [
        line
        for line in _section("Status and numbers").splitlines()
        if line.startswith("| ") and not line.startswith("| claim")
    ]
    commands = [row.split(" | ")[2] for row in rows]
    assert all(re.search(r"`(python|laptrain) [^`]+`", c) for c in commands), commands
    for test in ("tests/test_gguf_llama_cpp.py", "tests/test_dpo_vs_trl_smoke.py"):
        assert f"pytest -m slow -n 0 {test}`" in _section("Status and numbers")
        assert (ROOT / test).is_file()


def test_every_file_the_readme_links_exists():
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    missing = [t for t in targets if not t.startswith("http") and not (ROOT / t).exists()]
    assert targets and missing == []


def test_every_anchor_the_readme_links_is_a_heading():
    """The outline's links land: GitHub's slug of a heading is its lowercased text with
    punctuation dropped and spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", README, flags=re.S | re.M), re.M)
    slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
    anchors = re.findall(r"\]\(#([^)]+)\)", README)
    assert len(anchors) >= 10 and sorted(set(anchors) - slugs) == []
