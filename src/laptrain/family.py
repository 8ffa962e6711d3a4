"""The family contract: what a model family may give laptrain, and how laptrain finds it
(docs/model_families.md walks through writing one).

A family is a package whose ``__init__.py`` defines ``FAMILY = Family(...)``; a module's family is
that of the first package on its ``_target_``'s path (the ``laptrain.families`` entry points and
``user/`` list them all). Hooks import their work when called, so the launch asks for a family
before torch is imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

ENTRY_POINTS = "laptrain.families"
# a package's __init__.py that declares a family: `FAMILY = ...` or `from .x import FAMILY`
_DECLARES = re.compile(r"^(FAMILY\s*(:[^=\n]*)?=|from\s+\S+\s+import\s+[^#\n]*\bFAMILY\b)", re.M)


@dataclass(frozen=True)
class FileRules:
    """How one datamodule's local files are checked before the run folder exists: ``options``, the
    datamodule arguments its ``rules(files, **options)`` read (raising one line at fault)."""

    options: dict[str, type | tuple[type, ...]]
    rules: Callable[..., Any]


class Commands(Protocol):
    """A family's own ``laptrain`` commands (the module its ``commands`` hook returns)."""

    COMMANDS: Mapping[str, Callable[[Any], int]]  # command name -> run(args) -> exit code

    def add_commands(self, commands: Any) -> None:
        """Add the commands' parsers to ``laptrain``'s sub-parsers (argparse)."""


class Exports(Protocol):
    """A family's own ``laptrain export`` formats (the module its ``exports`` hook returns)."""

    FORMATS: Mapping[str, Callable[[Any], int]]  # --format -> export(args) -> exit code

    def add_export_arguments(self, parser: Any) -> None:
        """Add the family's own options to ``laptrain export``'s parser (argparse)."""


class SmokeBuilds(Protocol):
    """A family at smoke-test size (the module its ``smoke`` hook returns): ``build(seed, steps)``
    (optional ``kind=``/``precision=`` keywords) returns a fresh (module, datamodule);
    ``predict(module, batch)`` predicts one batch; an optional ``note(kind)`` says what runs."""

    def build(self, seed: int, steps: int, **cell: Any) -> tuple[Any, Any]: ...

    def predict(self, module: Any, batch: Any) -> Any: ...


@dataclass(frozen=True)
class Family:
    """What one model family gives laptrain: a ``name`` (smoke rows, ``laptrain doctor``), a
    one-line ``summary``, and optional hooks; docs/model_families.md has each field's signature and
    caller."""

    name: str
    summary: str
    refuse_precision: Callable[[str, str], str | None] | None = None
    sizing: Callable[[Any, Any], tuple[list[str], bool]] | None = None
    auto_settings: Callable[..., dict[str, Any]] | None = None
    doctor_check: Callable[[Mapping[str, Any]], Any] | None = None
    file_rules: Callable[[str], FileRules | None] | None = None
    fsdp_layers: Callable[[Any], set[type]] | None = None
    fsdp_refusal: str | None = None
    manual_optimization: bool = False
    why: Callable[[Any], list[Any]] | None = None
    commands: Callable[[], Commands] | None = None
    exports: Callable[[], Exports] | None = None
    smoke: Callable[[], SmokeBuilds] | None = None
    model_files: Callable[[], Mapping[str, Callable[..., Path]]] | None = None

    def refusal(self, device_kind: str, precision: str) -> str | None:
        return (
            None if self.refuse_precision is None else self.refuse_precision(device_kind, precision)
        )


def _declaring_package(parts: list[str]) -> str | None:
    """The first package on the dotted path ``parts`` (the class left out) whose ``__init__.py``
    assigns or imports ``FAMILY``, found on disk: a ``_target_`` in torch costs a lookup, no
    import."""
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level name: imports nothing
    except (ImportError, ValueError):
        return None
    if spec is None or spec.submodule_search_locations is None:
        return None
    name, locations, init = (
        parts[0],
        [Path(p) for p in spec.submodule_search_locations],
        spec.origin,
    )
    for part in parts[1:-1] + [None]:
        if (
            init
            and init.endswith("__init__.py")
            and _DECLARES.search(Path(init).read_text("utf-8"))
        ):
            return name
        if part is None:
            return None
        locations = [loc / part for loc in locations if (loc / part).is_dir()]
        if not locations:
            return None
        found = [loc / "__init__.py" for loc in locations if (loc / "__init__.py").is_file()]
        name, init = f"{name}.{part}", str(found[0]) if found else None
    return None


def family_of_target(target: object) -> Family | None:
    """The family of a ``_target_``: the ``FAMILY`` of the first package on its path that defines
    one, or None. Only that package is imported; one that fails to import answers None
    (instantiating the target reports the error in full)."""
    package = _declaring_package(str(target).split("."))
    if package is None:
        return None
    try:
        found = getattr(importlib.import_module(package), "FAMILY", None)
    except Exception:
        return None
    return found if isinstance(found, Family) else None


def family_of(config: Mapping[str, Any] | None) -> Family | None:
    """The family of a ``model`` (or ``data``) config, by its ``_target_``; None without one."""
    if not isinstance(config, Mapping):
        return None
    target = config.get("_target_")
    return None if target is None else family_of_target(str(target))


def family_of_module(module: object) -> Family | None:
    """The family of a built module: that of its class or of the nearest base class with one."""
    for cls in type(module).__mro__:
        found = family_of_target(f"{cls.__module__}.{cls.__qualname__}")
        if found is not None:
            return found
    return None


def family_of_preset(name: str | None, conf: Path) -> Family | None:
    """The family of ``conf/model/<name>.yaml``, or None (no such preset, or no family)."""
    if not name:
        return None
    path = conf / "model" / f"{name}.yaml"
    if not path.is_file():
        return None
    from omegaconf import OmegaConf

    return family_of(OmegaConf.to_container(OmegaConf.load(path)))  # type: ignore[arg-type]


def installed_families(project: Path | None = None) -> list[Family]:
    """The families of the ``laptrain.families`` entry points and, given a project's root, of its
    ``user/<task>/__init__.py``; in name order, the first of a name kept, one that fails to load
    left out (its own import reports it)."""
    from importlib.metadata import entry_points

    loaders: list[Callable[[], Any]] = [point.load for point in entry_points(group=ENTRY_POINTS)]
    if project is not None:
        for init in sorted((project / "user").glob("*/__init__.py")):
            if _DECLARES.search(init.read_text("utf-8")):
                name = f"user.{init.parent.name}"
                loaders.append(lambda name=name: importlib.import_module(name).FAMILY)
    found: dict[str, Family] = {}
    for load in loaders:
        try:
            family = load()
        except Exception:
            continue
        if isinstance(family, Family):
            found.setdefault(family.name, family)
    return [found[name] for name in sorted(found)]
