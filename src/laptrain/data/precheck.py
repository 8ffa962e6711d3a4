"""The launcher's data check before the run folder exists: the local files of a datamodule whose
family gives ``file_rules`` are read and checked by its rules, so a bad file is refused in about
a second, before torch is imported."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from laptrain.data.splits import check_folds
from laptrain.data.tables import resolve_files
from laptrain.family import FileRules, family_of_target
from laptrain.files import file_digest

CHECK_VERSION = 2  # raise when the rules change: files stamped as checked are read again


def file_rules_of(target: str) -> FileRules | None:
    """How the datamodule ``target`` (a ``_target_``) has its local files checked here: its
    family's ``file_rules`` hook, or None (checked when the datamodule reads them)."""
    family = family_of_target(target)
    if family is None or family.file_rules is None:
        return None
    return family.file_rules(target.rpartition(".")[2])


def check_data_config(data: Any) -> None:
    """``train.py``'s data check on the composed ``data`` config, before the run folder exists:
    local files are checked by their datamodule's family rules (``Family.file_rules``); files that
    passed are stamped under ``<cache_dir>/checked/``."""
    from omegaconf import OmegaConf

    try:
        plain = OmegaConf.to_container(data, resolve=True) if data is not None else None
    except Exception:  # an interpolation that cannot resolve: the config check reports it
        return
    if not isinstance(plain, dict):
        return
    found = file_rules_of(str(plain.get("_target_")))
    if found is None:
        return
    spec, check = found.options, found.rules
    kwargs = {k: plain[k] for k in spec if k in plain}
    if any(not isinstance(v, spec[k]) or isinstance(v, bool) for k, v in kwargs.items()):
        return
    if "folds" in kwargs:  # a builder's data too (the default stdlib docstrings)
        check_folds(kwargs["folds"], kwargs.get("fold", 0))
    files = plain.get("files")
    if not isinstance(files, dict) or not any(v is not None for v in files.values()):
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
