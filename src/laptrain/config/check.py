"""Check the whole composed config before any data or model work, and say what is wrong in one line:
every ``_target_`` bound to its constructor's signature up front (torchtune's
``config/_validate.py``), since Hydra instantiates lazily."""

from __future__ import annotations

import copy
import difflib
import importlib
import inspect
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from laptrain.config.batch_request import batch_follows_profile
from laptrain.config.errors import ConfigError
from laptrain.config.plugin_extras import (
    MissingExtra,
    check_config_extras,
    check_plugin_extras,
)

HYDRA_KEYS = {"_target_", "_partial_", "_convert_", "_recursive_", "_args_"}
# laptrain's own reserved keys in a model YAML, removed before instantiation (laptrain.config.overrides).
LAPTRAIN_KEYS = {"_argv_hook_", "_metric_"}
# A callbacks entry's ``enabled`` says whether the run builds it (laptrain.callbacks.acting).
BUILD_SWITCH = "enabled"


# Where a user's own code goes: a package at the clone's root, beside train.py, which Python puts
# first on sys.path when it runs a script (docs/your_model.md; `laptrain new NAME` writes there).
USER_FOLDER = "user"
# The class each of these sections must build, and what it is called in a message.
ROLES = {"model": "LightningModule", "data": "LightningDataModule"}


class TargetNotFound(ImportError):
    """A ``_target_`` that does not import; the message is one line naming the fix."""


def _locate(target: str) -> Any:
    """The object ``target`` names, imported as Hydra would; :class:`TargetNotFound` with one line
    saying which part is missing (Hydra's own error spans several lines and logs another)."""
    parts = target.split(".")
    module, found = None, 0
    for cut in range(1, len(parts) + 1):  # the longest prefix that is a module
        name = ".".join(parts[:cut])
        try:
            module, found = importlib.import_module(name), cut
        except ModuleNotFoundError as err:
            if err.name == name:
                break  # no such module: the rest are attributes
            raise TargetNotFound(f"importing {name} failed ({_first_line(err)})") from err
        except Exception as err:  # the module itself fails on import
            raise TargetNotFound(f"importing {name} failed ({_first_line(err)})") from err
    if module is None and parts[0] == USER_FOLDER:
        raise TargetNotFound(
            f"there is no {USER_FOLDER} package on the import path: run python train.py from the "
            f"clone that holds {USER_FOLDER}/ (laptrain new writes it there), or add that clone's "
            "folder to PYTHONPATH"
        )
    if module is None:
        raise TargetNotFound(
            f"there is no module {parts[0]} on the import path: put your code in the "
            f"{USER_FOLDER}/ folder beside train.py (e.g. {USER_FOLDER}/{parts[0]}.py, named "
            f"_target_: {USER_FOLDER}.{target}; docs/your_model.md), or add its folder to "
            "PYTHONPATH"
        )
    return _attribute(module, ".".join(parts[:found]), parts[found:])


def _attribute(module: Any, name: str, rest: list[str]) -> Any:
    obj = module
    for attr in rest:
        if not hasattr(obj, attr):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(attr, names, n=1)
            where = getattr(module, "__file__", None) or name
            raise TargetNotFound(
                f"{name} ({where}) has no {attr}"
                + (f" (did you mean {close[0]}?)" if close else "")
            )
        obj = getattr(obj, attr)
    return obj


def _first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"


def _role_problem(obj: Any, target: str, path: str) -> str | None:
    """A model or data ``_target_`` whose class is not what Lightning trains."""
    role = ROLES.get(path)
    if role is None or not inspect.isclass(obj):
        return None
    import lightning.pytorch as pl

    if issubclass(obj, getattr(pl, role)):
        return None
    other = next((r for r in ROLES.values() if r != role and issubclass(obj, getattr(pl, r))), None)
    what = f"a {other}" if other else f"not a {role} (its bases: {_bases(obj)})"
    return (
        f"{path}._target_={target} is {what}: point {path}._target_ at a class that subclasses "
        f"lightning.pytorch.{role} (docs/your_model.md)"
    )


def _bases(cls: type) -> str:
    return ", ".join(f"{b.__module__}.{b.__qualname__}" for b in cls.__mro__[1:-1]) or "object"


def _signature(obj: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    except (TypeError, ValueError):
        return None


def _hints(obj: Any) -> dict[str, Any]:
    func = obj.__init__ if inspect.isclass(obj) else obj
    try:
        return typing.get_type_hints(func)
    except Exception:  # unresolvable forward references: check names only
        return {}


def _matches(value: Any, hint: Any) -> bool:
    """Whether a config value can be passed where ``hint`` is annotated (lenient where unsure)."""
    if hint is Any or hint is inspect.Parameter.empty or isinstance(hint, typing.TypeVar):
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_matches(value, h) for h in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if value is None:
        return False
    if isinstance(value, Mapping) and not (origin or inspect.isclass(hint)):
        return True
    base = origin or hint
    if not inspect.isclass(base):
        return True
    if base is bool:
        return isinstance(value, bool)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if base is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if base is str:
        return isinstance(value, str)
    if issubclass(base, PurePath):
        return isinstance(value, str | PurePath)
    if base in (list, tuple, set, frozenset) or (
        issubclass(base, Sequence) and not issubclass(base, str)
    ):
        return isinstance(value, list | tuple)
    if issubclass(base, Mapping):
        return isinstance(value, Mapping)
    if isinstance(value, Mapping):  # a nested config that builds (or describes) the object
        return True
    return isinstance(value, base)


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(_describe(h) for h in typing.get_args(hint))
    if origin is typing.Literal:
        return " or ".join(repr(v) for v in typing.get_args(hint))
    text = getattr(hint, "__name__", None) or str(hint)
    return text.replace("typing.", "")


def check_targets(node: Any, path: str = "") -> list[str]:
    """Problems of every ``_target_`` under ``node`` (a resolved plain container), one per item."""
    problems: list[str] = []
    if isinstance(node, Mapping):
        target = node.get("_target_")
        if isinstance(target, str):
            problems += _check_one(target, node, path)
        for key, value in node.items():
            if key not in HYDRA_KEYS:
                problems += check_targets(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            problems += check_targets(value, f"{path}[{i}]")
    return problems


def _check_one(target: str, node: Mapping[str, Any], path: str) -> list[str]:
    where = path or "<root>"
    try:
        obj = _locate(target)
    except TargetNotFound as err:
        return [f"{where}._target_={target} cannot be imported: {err}"]
    role = _role_problem(obj, target, path)
    if role:
        return [role]  # its arguments are another class's: no use listing them
    signature = _signature(obj)
    if signature is None:
        return []
    params = signature.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    hints = _hints(obj)
    problems = []
    switch = {BUILD_SWITCH} if path.startswith("callbacks.") else set()
    for key, value in node.items():
        if key in HYDRA_KEYS | LAPTRAIN_KEYS | switch:
            continue
        name = f"{path}.{key}" if path else str(key)
        if key not in params:
            if not takes_any:
                close = difflib.get_close_matches(str(key), list(params), n=1)
                hint = f" (did you mean {path + '.' if path else ''}{close[0]}?)" if close else ""
                problems.append(f"{name} is not an argument of {target}{hint}")
            continue
        hint = hints.get(key, params[key].annotation)
        if isinstance(hint, str):  # unresolved annotation
            continue
        if not _matches(value, hint):
            problems.append(
                f"{name}={value!r} must be {_describe(hint)} (argument {key} of {target})"
            )
    return problems


# Trainer values Lightning refuses only once fit has started (or silently misreads).
TRAINER_RULES: dict[str, tuple[Any, str]] = {
    "max_epochs": (lambda v: v is None or v >= -1, "an int >= -1 (-1: no limit)"),
    "min_epochs": (lambda v: v is None or v >= 0, "an int >= 0"),
    "max_steps": (lambda v: v >= -1, "an int >= -1 (-1: no limit)"),
    "min_steps": (lambda v: v is None or v >= 0, "an int >= 0"),
    "accumulate_grad_batches": (lambda v: v >= 1, "an int >= 1"),
    "check_val_every_n_epoch": (lambda v: v is None or v >= 1, "an int >= 1 or null"),
    "log_every_n_steps": (lambda v: v is None or v >= 1, "an int >= 1"),
    "val_check_interval": (lambda v: v is None or v > 0, "a number > 0"),
    "gradient_clip_val": (lambda v: v is None or v >= 0, "a number >= 0"),
    "limit_train_batches": (lambda v: v is None or v >= 0, "a number >= 0"),
    "limit_val_batches": (lambda v: v is None or v >= 0, "a number >= 0"),
    "limit_test_batches": (lambda v: v is None or v >= 0, "a number >= 0"),
}


def check_trainer_values(trainer: Mapping[str, Any], data_target: object = None) -> list[str]:
    problems = []
    for key, (ok, text) in TRAINER_RULES.items():
        value = trainer.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and not ok(value):
            problems.append(f"trainer.{key}={value} must be {text}")
    laptrains_data = str(data_target or "").startswith("laptrain.")
    if trainer.get("use_distributed_sampler") is True and laptrains_data:
        # Lightning would rebuild laptrain's batch samplers (laptrain/data/sampler.py), which
        # shard by rank themselves. A user's datamodule gets Lightning's sampler (null or true).
        problems.append(
            "trainer.use_distributed_sampler=true does not fit laptrain's data modules, which give "
            "each process its own share of every batch: leave it null (docs/sweeps.md, Several "
            "processes)"
        )
    return problems


def check_run_name(value: object) -> list[str]:
    """``run_name`` is one folder under ``outputs/``: a path or an empty name is refused before
    Hydra makes any folder (``../../x`` writes outside it, ``a/b`` is a run ``laptrain runs`` never
    lists)."""
    if value is None:
        return []
    name = str(value)
    if name.strip() in ("", ".", "..") or "/" in name or "\\" in name:
        return [
            f"run_name={name!r} must name one folder under outputs/ (not empty, no '/' or '\\', "
            "not '.' or '..'): set run_name=<name>, e.g. run_name=my_run"
        ]
    return []


def _real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_hardware_values(hardware: Mapping[str, Any]) -> list[str]:
    """The profile's numbers, refused up front where they would give a traceback mid-run or a run
    that never ends: ``memory_fraction`` in (0, 1], ``memory_budget_gb`` finite > 0 or null,
    ``torch_threads`` an int >= 1 or null / 0 (torch's default), ``malloc_keep_freed`` a bool."""
    problems = []
    fraction = hardware.get("memory_fraction")
    if fraction is not None and not (_real(fraction) and 0 < fraction <= 1):
        problems.append(
            f"hardware.memory_fraction={fraction} must be a number in (0, 1], the share of free "
            "memory the run may use: e.g. hardware.memory_fraction=0.8"
        )
    budget = hardware.get("memory_budget_gb")
    if budget is not None and not (_real(budget) and math.isfinite(budget) and budget > 0):
        problems.append(
            f"hardware.memory_budget_gb={budget} must be a number of GiB (2^30 bytes) > 0, or null to take "
            "hardware.memory_fraction of free memory: e.g. hardware.memory_budget_gb=12"
        )
    threads = hardware.get("torch_threads")
    if threads is not None and not (
        isinstance(threads, int) and not isinstance(threads, bool) and threads >= 0
    ):
        problems.append(
            f"hardware.torch_threads={threads} must be an int >= 1, or null for torch's default: "
            "e.g. hardware.torch_threads=4"
        )
    keep = hardware.get("malloc_keep_freed", False)
    if not isinstance(keep, bool):
        problems.append(
            f"hardware.malloc_keep_freed={keep} must be true or false (glibc's malloc keeps freed "
            "memory, docs/hardware.md §9c): e.g. hardware.malloc_keep_freed=false"
        )
    return problems


def _shown_devices(devices: object) -> str:
    if isinstance(devices, Sequence) and not isinstance(devices, str):
        return "[" + ",".join(str(d) for d in devices) + "]"
    return str(devices)


def check_launcher_values(cfg: DictConfig) -> list[str]:
    """``launcher=slurm`` needs ``trainer.devices`` as a count (sbatch's and submitit's
    ``gpus_per_node``/``tasks_per_node`` are ints, hydra_plugins/hydra_submitit_launcher/config.py):
    ``auto``, ``-1`` and a GPU list are refused in one line before the launcher resolves."""
    target = OmegaConf.select(cfg, "hydra.launcher._target_", default=None)
    if not str(target or "").endswith("SlurmLauncher"):
        return []
    devices = OmegaConf.select(cfg, "trainer.devices", default=None)
    if isinstance(devices, Sequence) and not isinstance(devices, str):
        devices = list(devices)
    if type(devices) is int and devices >= 1:
        return []
    if isinstance(devices, str) and devices.strip().isdigit() and int(devices) >= 1:
        return []
    return [
        f"launcher=slurm asks SLURM for trainer.devices GPUs and tasks per node, which takes a "
        f"count, not trainer.devices={_shown_devices(devices)}: set trainer.devices=<count>, "
        "e.g. trainer.devices=4 (SLURM picks the GPUs)"
    ]


def check_config(cfg: DictConfig, built_with: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`ConfigError` listing every problem of the composed config, or return.
    ``built_with``: dotted keys the run passes at instantiation instead (``{"data.batch_size":
    1}``)."""
    launcher_problems = check_launcher_values(cfg)
    if launcher_problems:  # before resolving: the launcher's fields interpolate trainer.devices
        raise ConfigError("; ".join(launcher_problems))
    plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    assert isinstance(plain, dict)
    plain.pop("hydra", None)
    for dotted, value in (built_with or {}).items():
        parent = plain
        *heads, last = dotted.split(".")
        for head in heads:
            parent = parent.get(head) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and last in parent:
            parent[last] = value
    trainer = plain.get("trainer")
    if isinstance(trainer, dict) and trainer.get("use_distributed_sampler", False) is None:
        del trainer["use_distributed_sampler"]  # null: the run decides (data/user_loaders.py)
    problems = check_targets(plain) + check_run_name(plain.get("run_name"))
    if isinstance(plain.get("trainer"), Mapping):
        data = plain.get("data")
        target = data.get("_target_") if isinstance(data, Mapping) else None
        problems += check_trainer_values(plain["trainer"], target)
    if isinstance(plain.get("hardware"), Mapping):
        problems += check_hardware_values(plain["hardware"])
    if problems:
        raise ConfigError("; ".join(problems))


def hydra_error_line(err: BaseException, conf_dir: str = "conf", guess: str = "") -> str | None:
    """One line for a Hydra composition or override-parsing error, or None for other errors."""
    from hydra.errors import (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
    )

    text = str(err)
    if isinstance(err, MissingConfigException):
        found = re.search(r"Could not find '([^/']+)/([^']+)'", text)
        options = re.findall(r"^\t(\S+)$", text.split("Config search path")[0], re.MULTILINE)
        if found:
            group, choice = found.groups()
            close = difflib.get_close_matches(choice, options, n=1)
            guess = f" (did you mean {group}={close[0]}?)" if close else ""
            return (
                f"no {group}={choice}{guess}: choose one of {', '.join(options)} "
                f"(files in {conf_dir}/{group}/)"
            )
        return text.splitlines()[0]
    if isinstance(err, OverrideParseException):
        return (
            f"cannot parse an override ({text.splitlines()[0]}): write key=value, quote odd values"
        )
    if isinstance(err, ConfigCompositionException):
        missing = re.search(r"Could not override '([^']+)'.*?use \+(\S+)", text, re.DOTALL)
        if missing:
            key, append = missing.groups()
            return (
                f"{key} is not a key of the config ({guess or 'see `python train.py --cfg job`'}); "
                f"to add a new key write +{append}"
            )
        sweep = re.search(r"Ambiguous value for argument '([^']+)'", text)
        if sweep:
            return (
                f"{sweep.group(1)} lists several values: add -m to sweep over them, or write "
                "key=[a,b] for a list"
            )
        return " ".join(line.strip() for line in text.splitlines() if line.strip())
    return None


def _closest_key(err: BaseException, conf_dir: str, config_name: str, overrides: list[str]) -> str:
    """ "did you mean <key>?" for an override of a key the config lacks, else ""."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    found = re.search(r"Could not override '([^']+)'", str(err))
    if not found:
        return ""
    key = found.group(1)
    rest = [o for o in overrides if o.split("=", 1)[0] != key]
    try:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            cfg = compose(config_name, overrides=rest)
    except Exception:
        return ""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if not isinstance(node, DictConfig):
        return ""
    close = difflib.get_close_matches(leaf, [str(k) for k in node], n=1)
    return f"did you mean {parent + '.' if parent else ''}{close[0]}?" if close else ""


def _first_choice(override: str) -> str:
    """``key=a,b`` -> ``key=a`` (a sweep's first job stands for the rest in the pre-check);
    an Optuna search range ``key=interval(lo, hi)`` -> ``key=lo``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_override(override)
    if not parsed.is_sweep_override():
        return override
    if parsed.is_interval_sweep():  # not enumerable: its low end stands for it
        return f"{parsed.get_key_element()}={parsed.value().start}"
    first = next(iter(parsed.sweep_string_iterator()))
    return f"{parsed.get_key_element()}={first}"


def _overrides(argv: Sequence[str]) -> tuple[list[str], bool]:
    """The overrides in a ``train.py`` argv, and whether ``-m`` asks for a sweep."""
    from laptrain.config.overrides import override_indices

    indices = set(override_indices(argv))
    found = [argv[i] for i in sorted(indices)]
    rest = [a for i, a in enumerate(argv) if i and i not in indices]
    multirun = any(a in ("-m", "--multirun") or a.startswith("--mu") for a in rest)
    return found, multirun


def compose_argv(argv: Sequence[str], conf_dir: str, config_name: str = "train") -> DictConfig:
    """The config a ``train.py`` command line asks for, composed as Hydra will, before Hydra makes
    a run folder (no torch import). Raises :class:`ConfigError` with one line."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    overrides, multirun = _overrides(argv)
    try:
        check_plugin_extras(overrides, Path(conf_dir))
    except MissingExtra as err:
        raise ConfigError(str(err)) from None
    try:
        if multirun:
            overrides = [_first_choice(o) for o in overrides]
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
    except Exception as err:
        line = hydra_error_line(err, "conf", _closest_key(err, conf_dir, config_name, overrides))
        if line is None:
            raise
        raise ConfigError(line) from err
    finally:
        GlobalHydra.instance().clear()
    try:  # an option chosen in a file (a preset, conf/local/) rather than on the command line
        check_config_extras(cfg)
    except MissingExtra as err:
        raise ConfigError(str(err)) from None
    from laptrain.loggers.tracking import check_wandb_modes

    check_wandb_modes(cfg.get("logger"))  # W&B online without a key: refused, never a prompt
    with open_dict(cfg):  # Hydra names the run folder only when it starts the job
        cfg.hydra.runtime.output_dir = "<run folder>"
    HydraConfig().set_config(cfg)
    return cfg


def _as_built(cfg: DictConfig) -> tuple[DictConfig, dict[str, Any] | None]:
    """The config as the run instantiates it, and the values passed instead of the config's (under
    ``from_profile`` a datamodule taking a batch gets a number, one that does not loses the key)."""
    if not batch_follows_profile(cfg):
        return cfg, None
    target = OmegaConf.select(cfg, "data._target_", default=None)
    try:
        obj = _locate(str(target)) if target else None
    except TargetNotFound:
        obj = None  # reported by check_targets
    if obj is None or hasattr(obj, "with_batch_sizes") or _takes(obj, "batch_size"):
        return cfg, {"data.batch_size": 1}
    built = copy.deepcopy(cfg)
    with open_dict(built):
        built.data.pop("batch_size")
    return built, None


def _takes(obj: Any, name: str) -> bool:
    signature = _signature(obj)
    if signature is None:
        return True
    params = signature.parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def check_composed(cfg: DictConfig) -> None:
    """:func:`check_config` as the run builds it (imports targets: after the profile's env)."""
    try:
        check_config(*_as_built(cfg))
    except ConfigError:
        raise
    except Exception as err:  # an interpolation that cannot resolve, e.g. a missing env var
        raise ConfigError(f"config cannot be resolved: {err}".splitlines()[0]) from err
