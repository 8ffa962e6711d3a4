"""The argument every ``laptrain`` command that reads a run declares (laptrain's and the families'):
the run, by name or folder, and ``--root`` (:func:`laptrain.run_folder.listing.resolve_run`)."""

from __future__ import annotations

import argparse

from laptrain.run_folder.listing import RUNS_ROOT

RUN = "a run as `laptrain runs` names it (e.g. tiny_classifier-text_csv), or its folder"
ROOT_HELP = "where runs live: the folder a run's name is looked up in (default: %(default)s)"


def add_run_argument(parser: argparse.ArgumentParser, what: str = RUN, dest: str = "run") -> None:
    """The run a command reads and ``--root``: every command that takes a run resolves it with
    :func:`laptrain.run_folder.listing.resolve_run`."""
    parser.add_argument(dest, help=what)
    parser.add_argument("--root", default=RUNS_ROOT, help=ROOT_HELP)
