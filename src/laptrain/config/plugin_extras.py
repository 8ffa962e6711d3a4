"""Group options that need a Hydra plugin from an optional extra, checked before Hydra composes.

Gap it fills: without the plugin Hydra answers ``launcher=slurm`` with "Could not find
'hydra/launcher/submitit_slurm' ... choose one of basic", and a sweep whose sampler cannot be
imported (``-m hparams_search=optuna`` without optuna) prints an error and exits 0. Here the option
is matched to the extra that provides its plugin and refused in one line naming the install.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

# Hydra config `<group>/<name>` -> (module that provides it, what it is, the extra that installs it)
PLUGINS = {
    "hydra/launcher/submitit_slurm": (
        "hydra_plugins.hydra_submitit_launcher",
        "hydra-submitit-launcher",
        "sweep",
    ),
    "hydra/launcher/submitit_local": (
        "hydra_plugins.hydra_submitit_launcher",
        "hydra-submitit-launcher",
        "sweep",
    ),
    "hydra/sweeper/laptrain_optuna": ("optuna", "optuna", "sweep"),
}


class MissingExtra(ValueError):
    """A group option needs a package from an extra that is not installed."""


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def plugins_of(override: str, conf_dir: Path) -> list[str]:
    """The plugin configs (``hydra/<group>/<name>``) that one ``group=option`` override selects:
    itself when it is a ``hydra/...`` choice, else the ``override /hydra/...`` entries of
    ``conf/<group>/<option>.yaml``'s defaults list."""
    key, sep, value = override.lstrip("+~").partition("=")
    if not sep or "." in key or not value:
        return []
    if key.startswith("hydra/"):
        return [f"{key}/{value}"]
    path = conf_dir / key / f"{value}.yaml"
    if not path.is_file():
        return []
    import yaml

    try:
        node = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return []  # Hydra's own composition reports the broken file
    found = []
    for entry in node.get("defaults", []) if isinstance(node, dict) else []:
        if isinstance(entry, dict):
            for group, choice in entry.items():
                group = str(group).removeprefix("override ").strip().lstrip("/")
                if group.startswith("hydra/"):
                    found.append(f"{group}/{choice}")
    return found


def check_plugin_extras(overrides: Sequence[str], conf_dir: Path, is_installed=installed) -> None:
    """Raise :class:`MissingExtra` (one line) for the first override whose plugin is missing."""
    for override in overrides:
        for plugin in plugins_of(override, conf_dir):
            if plugin not in PLUGINS:
                continue
            module, name, extra = PLUGINS[plugin]
            if not is_installed(module):
                raise MissingExtra(
                    f"{override} needs {name}, from laptrain's [{extra}] extra, which is not "
                    f'installed: pip install -e ".[{extra}]"'
                )
