"""Group options that need a package from an optional extra, refused in one line naming the install
before Hydra composes: without the plugin Hydra answers ``launcher=slurm`` with "Could not find
'hydra/launcher/submitit_slurm'", a sweep without optuna exits 0, and ``logger=mlflow`` without
mlflow fails only once the run folder is made."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Config `<group>/<name>` -> (module it needs, what to install, the extra that installs it): a Hydra
# plugin's config, or a laptrain option whose `_target_` imports that module.
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
    "logger/mlflow": ("mlflow", "mlflow-skinny", "mlflow"),
    "logger/wandb": ("wandb", "wandb", "wandb"),
}


class MissingExtra(ValueError):
    """A group option needs a package from an extra that is not installed."""


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def _options(value: str) -> list[str]:
    """The options one group override names: ``a``, ``[a,b]`` or a sweep ``a,b``."""
    value = value.strip()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    return [o.strip().strip("'\"") for o in value.split(",") if o.strip()]


def plugins_of(override: str, conf_dir: Path) -> list[str]:
    """The plugin configs (``hydra/<group>/<name>``) that one ``group=option`` override selects:
    itself when it is a ``hydra/...`` choice, else the ``override /hydra/...`` entries of
    ``conf/<group>/<option>.yaml``'s defaults list; and the options of :data:`PLUGINS` it selects,
    named or in that defaults list (``logger=[tensorboard,mlflow]``, an experiment preset's
    ``override /logger: wandb``)."""
    key, sep, value = override.lstrip("+~").partition("=")
    if not sep or "." in key or not value:
        return []
    if key.startswith("hydra/"):
        return [f"{key}/{value}"]
    found = []
    for option in _options(value):
        if f"{key}/{option}" in PLUGINS:
            found.append(f"{key}/{option}")
        found += _defaults_plugins(conf_dir / key / f"{option}.yaml")
    return found


def _defaults_plugins(path: Path) -> list[str]:
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
                choices = choice if isinstance(choice, list) else [choice]
                if group.startswith("hydra/"):
                    found += [f"{group}/{c}" for c in choices]
                else:
                    found += [f"{group}/{c}" for c in choices if f"{group}/{c}" in PLUGINS]
    return found


def _refuse(what: str, plugin: str, is_installed=None) -> None:
    module, name, extra = PLUGINS[plugin]
    if not (is_installed or installed)(module):  # looked up now: tests replace `installed`
        raise MissingExtra(
            f"{what} needs {name}, from laptrain's [{extra}] extra, which is not "
            f'installed: pip install -e ".[{extra}]"'
        )


def check_plugin_extras(overrides: Sequence[str], conf_dir: Path, is_installed=None) -> None:
    """Raise :class:`MissingExtra` (one line) for the first override whose plugin is missing."""
    for override in overrides:
        for plugin in plugins_of(override, conf_dir):
            if plugin in PLUGINS:
                _refuse(override, plugin, is_installed)


# Groups whose entries in the composed config are named as their options are (conf/logger/mlflow.yaml
# holds `mlflow:`), so the composed config tells which options were chosen however they were.
ENTRY_GROUPS = ("logger",)


def check_config_extras(cfg: Mapping[str, Any], is_installed=None) -> None:
    """:func:`check_plugin_extras` for what the composed config holds, however it got there (an
    experiment preset, conf/local/, the defaults list): ``logger.mlflow`` without the [mlflow]
    extra is refused in the same line, naming ``logger.mlflow``."""
    for group in ENTRY_GROUPS:
        entries = cfg.get(group)
        for name in entries if isinstance(entries, Mapping) else ():
            if f"{group}/{name}" in PLUGINS:
                _refuse(f"{group}.{name}", f"{group}/{name}", is_installed)
