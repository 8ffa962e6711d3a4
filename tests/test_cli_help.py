"""Every argument of every ``laptrain`` command has help, and its default shows in ``--help``."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from laptrain.commands import cli


def parsers(
    parser: argparse.ArgumentParser, name: str = "laptrain"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """The parser and every subcommand's, depth first."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                yield from parsers(child, f"{name} {sub}")


def test_every_argument_has_help_and_shows_its_default() -> None:
    seen = 0
    for name, parser in parsers(cli.build_parser()):
        assert isinstance(parser.formatter_class, type) and issubclass(
            parser.formatter_class, cli.HelpFormatter
        ), name
        formatter = parser._get_formatter()
        for action in parser._actions:
            seen += 1
            where = f"{name}: {action.option_strings or action.dest}"
            assert action.help and action.help.strip(), where
            shown = formatter._get_help_string(action)
            if not any(action.default is v for v in (None, False, argparse.SUPPRESS)):
                assert "default" in shown, where
            if action.required and action.option_strings:  # an option that must be given
                assert "required" in shown, where
            assert "%(default)s" not in shown or action.default is not argparse.SUPPRESS, where
        parser.format_help()  # every %(...)s in the help expands
    assert seen > 60


def test_bench_help_shows_the_defaults_in_argparse_s_form() -> None:
    [bench] = [p for n, p in parsers(cli.build_parser()) if n == "laptrain bench"]
    text = " ".join(bench.format_help().split())
    assert "timed steps (default: 30)" in text and "untimed first steps (default: 3)" in text
    assert "(default: None)" not in text
    [generate] = [p for n, p in parsers(cli.build_parser()) if n == "laptrain generate"]
    assert "0: greedy (default: 0.0)" in " ".join(generate.format_help().split())


def test_every_command_has_its_section_in_docs_cli_md() -> None:
    """docs/cli.md: a ``## `laptrain X` `` section for every command and subcommand the parser has,
    each with its exit codes, and the exit-code table with every code laptrain uses."""
    from laptrain.exit_codes import DOES_NOT_FIT_EXIT, NONFINITE_EXIT, PAUSED_EXIT
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "cli.md").read_text()
    sections = text.split("\n## ")
    names = [name for name, _ in parsers(cli.build_parser()) if name != "laptrain"]
    assert (
        len(names) == len(cli.command_table(cli.family_commands())) + 3
    )  # runs compare, runs summary, runs clean
    for name in names:
        [section] = [s for s in sections if s.startswith(f"`{name}`\n")]
        assert "Exit code" in " ".join(section.split()), name
    for code in (0, 1, 2, NONFINITE_EXIT, DOES_NOT_FIT_EXIT, PAUSED_EXIT, "130 / 143"):
        assert f"\n| {code} |" in text, code
