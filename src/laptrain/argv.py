"""Where Hydra accepts overrides on a command line, and how the launcher adds its own there.

Hydra parses ``sys.argv`` with argparse (hydra/_internal/utils.py ``get_args_parser``): the overrides
are one positional with ``nargs="*"``, so argparse takes them as one contiguous run. An override
after an option that follows other overrides (``a=1 --cfg job b=2``) is refused as an "unrecognized
argument". The launcher therefore inserts its overrides right after the user's last override, or
right after the script name when there is none, and never after an option (``--info`` takes an
optional value and would swallow it).
"""

from __future__ import annotations

from collections.abc import Sequence

# Hydra 1.3's options, as get_args_parser defines them (tests/test_argv.py compares).
VALUE_OPTIONS = frozenset(
    {
        "--cfg",
        "-c",
        "--package",
        "-p",
        "--config-path",
        "-cp",
        "--config-name",
        "-cn",
        "--config-dir",
        "-cd",
        "--experimental-rerun",
    }
)
INFO_CHOICES = frozenset({"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"})
OPTIONAL_VALUE_OPTIONS = {"--info": INFO_CHOICES, "-i": INFO_CHOICES}
SWITCHES = frozenset(
    {
        "--help",
        "-h",
        "--hydra-help",
        "--version",
        "--resolve",
        "--run",
        "-r",
        "--multirun",
        "-m",
        "--shell-completion",
        "-sc",
    }
)
_LONG = sorted(o for o in (*VALUE_OPTIONS, *OPTIONAL_VALUE_OPTIONS, *SWITCHES) if o[:2] == "--")


def _option(token: str) -> str:
    """The option a token names; argparse also accepts a unique prefix of a long option."""
    if token in VALUE_OPTIONS or token in OPTIONAL_VALUE_OPTIONS or token in SWITCHES:
        return token
    if token.startswith("--"):
        matches = [o for o in _LONG if o.startswith(token)]
        if len(matches) == 1:
            return matches[0]
    return token  # "--cfg=job", "-cjob": the value is inside the token


def override_indices(argv: Sequence[str]) -> list[int]:
    """Indices of the Hydra overrides in ``argv`` (``argv[0]`` is the script)."""
    indices = []
    i = 1
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return indices + list(range(i + 1, len(argv)))
        if not token.startswith("-") or token == "-":
            indices.append(i)
        else:
            option = _option(token)
            if option in VALUE_OPTIONS:
                i += 1  # its value
            elif (
                option in OPTIONAL_VALUE_OPTIONS
                and argv[i + 1 : i + 2]
                and (argv[i + 1] in OPTIONAL_VALUE_OPTIONS[option])
            ):
                i += 1
        i += 1
    return indices


def overrides(argv: Sequence[str]) -> list[str]:
    """The Hydra overrides in ``argv``, options and their values left out."""
    return [argv[i] for i in override_indices(argv)]


def insert_overrides(argv: Sequence[str], new: Sequence[str]) -> list[str]:
    """``argv`` with ``new`` overrides placed where Hydra's parser accepts them.

    After the last existing override (so the overrides stay one run and the launcher's come last),
    else right after the script name, before any option.
    """
    indices = override_indices(argv)
    at = indices[-1] + 1 if indices else min(1, len(argv))
    return [*argv[:at], *new, *argv[at:]]
