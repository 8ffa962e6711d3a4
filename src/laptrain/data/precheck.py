"""The data check the launcher runs on the composed ``data`` config, before the run folder exists:
the local files of a text-classification, instruction or preference config are read and checked by the rules
their datamodule applies (:mod:`laptrain.data.labelled_files`, :mod:`laptrain.data.instruction_rows`),
so a bad file is refused in about a second, before torch is imported."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laptrain.data.instruction_rows import check_instructions
from laptrain.data.labelled_files import read_labelled, resolve_files
from laptrain.data.preference_rows import check_preferences
from laptrain.files import file_digest

DATA_TARGET = "laptrain.data.text_classification.TextClassificationDataModule"
CHECK_VERSION = 2  # raise when the rules change: files stamped as checked are read again

_NONE = type(None)
_SPLIT_ARGS: dict[str, type | tuple[type, ...]] = {
    "encoding": str,
    "val_fraction": (int, float),
    "test_fraction": (int, float),
    "split_seed": int,
}
_LABELLED_ARGS = {
    **_SPLIT_ARGS,
    "text_column": str,
    "label_column": str,
    "group_column": (str, _NONE),
    "label_names": (list, _NONE),
    "incomplete_rows": str,
}
_INSTRUCTION_ARGS = {**_SPLIT_ARGS, "group_column": (str, _NONE), "system_prompt": (str, _NONE)}
INSTRUCTIONS_TARGET = "laptrain.data.instructions.InstructionDataModule"
PREFERENCES_TARGET = "laptrain.data.preferences.PreferenceDataModule"


@dataclass(frozen=True)
class FileRules:
    """How one datamodule's local files are checked before the run."""

    options: dict[str, type | tuple[type, ...]]  # the arguments its rules read, with their types
    rules: Callable[..., Any]  # reads and checks them: rules(files, **options), raises one line


def file_rules() -> dict[str, FileRules]:
    """One row per datamodule (its ``_target_``) whose local files are checked here: a data kind of
    its own adds a row. Built when asked, so a test that replaces a rule here is heard."""
    return {
        DATA_TARGET: FileRules(_LABELLED_ARGS, read_labelled),
        INSTRUCTIONS_TARGET: FileRules(_INSTRUCTION_ARGS, check_instructions),
        PREFERENCES_TARGET: FileRules(_INSTRUCTION_ARGS, check_preferences),
    }


def check_data_config(data: Any) -> None:
    """``train.py``'s data check on the composed ``data`` config, before the run folder exists:
    the local files of a text-classification, instruction or preference config are read and checked by the
    rules their datamodule applies; anything else (a hub dataset, a builder, another datamodule) is
    checked when the datamodule reads it. A value of the wrong type is left to the config check,
    which names the argument. Files that passed are stamped under ``<cache_dir>/checked/``."""
    from omegaconf import OmegaConf

    try:
        plain = OmegaConf.to_container(data, resolve=True) if data is not None else None
    except Exception:  # an interpolation that cannot resolve: the config check reports it
        return
    if not isinstance(plain, dict):
        return
    found = file_rules().get(str(plain.get("_target_")))
    if found is None:
        return
    spec, check = found.options, found.rules
    files = plain.get("files")
    if not isinstance(files, dict) or not any(v is not None for v in files.values()):
        return
    kwargs = {k: plain[k] for k in spec if k in plain}
    if any(not isinstance(v, spec[k]) or isinstance(v, bool) for k, v in kwargs.items()):
        return
    paths = resolve_files(files)
    stamp = {"version": CHECK_VERSION, "target": plain["_target_"], "options": kwargs}
    stamp["files"] = {k: file_digest(v) for k, v in paths.items()}
    key = hashlib.sha256(json.dumps(stamp, sort_keys=True).encode()).hexdigest()[:20]
    done = Path(str(plain.get("cache_dir") or ".cache/laptrain")).expanduser() / "checked" / key
    if done.exists():
        return
    check(files, **kwargs)
    done.parent.mkdir(parents=True, exist_ok=True)
    done.touch()
