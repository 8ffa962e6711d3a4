"""Where Hydra accepts overrides on a command line, and how the launcher adds its own there: Hydra's
argparse takes the overrides as one contiguous positional (``get_args_parser``,
hydra/_internal/utils.py), so they go right after the user's last override (or the script name),
never after an option (``--info`` would swallow it)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

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
    """``argv`` with ``new`` overrides after the last existing one (else right after the script
    name), where Hydra's parser accepts them."""
    indices = override_indices(argv)
    at = indices[-1] + 1 if indices else min(1, len(argv))
    return [*argv[:at], *new, *argv[at:]]


def selected_option(argv: Sequence[str], group: str, conf_dir: Path) -> str | None:
    """The option of a config group a command line selects: its last ``group=x`` override, else
    the ``override /group`` of a selected experiment, else ``train.yaml``'s default."""
    import yaml

    def last(key: str) -> str | None:
        values = [o.split("=", 1)[1] for o in overrides(argv) if o.split("=", 1)[0] == key]
        return values[-1] if values else None

    chosen = last(group)
    if chosen:
        return chosen
    experiment = last("experiment") or last("+experiment")
    sources = [conf_dir / "experiment" / f"{experiment}.yaml"] if experiment else []
    for source in [*sources, conf_dir / "train.yaml"]:
        if not source.is_file():
            continue
        for entry in (yaml.safe_load(source.read_text()) or {}).get("defaults", []) or []:
            if isinstance(entry, dict):
                for key, value in entry.items():
                    if key.replace("override ", "").strip().lstrip("/") == group and value:
                        return str(value)
    return None


def run_argv_hook(argv: Sequence[str], conf_dir: Path) -> tuple[list[str], list[str]]:
    """Let the selected model YAML rewrite the command line before Hydra composes.

    ``_argv_hook_: <module>.<function>`` gets ``(argv, yaml_path)`` and returns ``(argv, lines to
    print)``; its module must not import torch (it runs before the profile's environment)."""
    import importlib

    import yaml

    name = selected_option(argv, "model", conf_dir)
    path = conf_dir / "model" / f"{name}.yaml"
    if not name or not path.is_file():
        return list(argv), []
    hook = (yaml.safe_load(path.read_text()) or {}).get("_argv_hook_")
    if not hook:
        return list(argv), []
    module, _, function = str(hook).rpartition(".")
    return getattr(importlib.import_module(module), function)(list(argv), str(path))
