"""``laptrain export RUN --format F``: one command for every format (docs/export.md): the formats of
the run's family (``FAMILY.exports``), else onnx (:mod:`laptrain.commands.onnx_export`); a folder
that is no run goes to the installed family that names the format."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from laptrain.commands.arguments import add_run_argument
from laptrain.exit_codes import error_exit_code
from laptrain.family import Exports, family_of_target, installed_families
from laptrain.run_folder.listing import resolve_run

GENERIC = "onnx"  # laptrain's own format, for any LightningModule


def _run_target(run: Path) -> str | None:
    """The ``model._target_`` of the run's config (None: no run config)."""
    import yaml

    config = run / ".hydra" / "config.yaml"
    if not config.is_file():
        return None
    return ((yaml.safe_load(config.read_text()) or {}).get("model") or {}).get("_target_")


def _formats(run: Path, target: str | None) -> dict[str, Callable[[argparse.Namespace], int]]:
    """The formats ``run`` exports as, in their order: its family's, then onnx; a folder that is
    no run: every installed family's."""
    from laptrain.commands.onnx_export import export_module

    family = family_of_target(target) if target else None
    if (run / ".hydra").is_dir():
        families = [family] if family is not None else []
    else:
        families = installed_families()
    formats: dict[str, Callable[[argparse.Namespace], int]] = {}
    for found in families:
        if found.exports is not None:
            formats = {**found.exports().FORMATS, **formats}
    return {**formats, GENERIC: formats.get(GENERIC, export_module)}


def _unknown(form: str, run: Path, target: str | None, formats: Collection[str]) -> ValueError:
    """One line: what the run exports as, and which family's runs export as ``form``."""
    owner = next(
        (f for f in installed_families() if f.exports and form in f.exports().FORMATS), None
    )
    what = f"a {target.rsplit('.', 1)[-1]} run" if target else "no run"
    where = f"; {form} is for {owner.name} runs ({owner.summary})" if owner else ""
    return ValueError(
        f"--format {form}: {run} is {what}, which exports as {', '.join(formats)}{where}"
    )


def _refuse_other_formats_options(args: argparse.Namespace) -> None:
    """A family's own option (LoRA's ``--fuse``) with a format that family does not serve is
    refused, not silently ignored."""
    for dest, (default, formats) in getattr(args, "format_options", {}).items():
        if args.format not in formats and getattr(args, dest, default) != default:
            option = "--" + dest.replace("_", "-")
            raise ValueError(
                f"{option} is for --format {', '.join(formats)}, not {args.format}: drop {option}"
            )


def export_command(args: argparse.Namespace) -> int:
    """Export the run in ``--format`` (default: its family's first format, else onnx)."""
    try:
        args.path = resolve_run(args.path, args.root, any_folder=True)
        target = _run_target(args.path)
        formats = _formats(args.path, target)
        args.format = args.format or next(iter(formats))
        if args.format not in formats:
            raise _unknown(args.format, args.path, target, formats)
        _refuse_other_formats_options(args)
        return formats[args.format](args)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return error_exit_code(err)


def add_arguments(parser: argparse.ArgumentParser, families: list[Exports]) -> None:
    """``laptrain export``'s arguments, and those ``families`` add for their own formats."""
    add_run_argument(
        parser, "a run as `laptrain runs` names it or its folder, or a LoRA adapter folder", "path"
    )
    parser.add_argument(
        "--format",
        default=None,
        help="onnx: model.onnx for onnxruntime (any run); hf: a merged transformers folder, "
        "gguf: model.gguf for llama.cpp, Ollama and LM Studio, mlx: an mlx-lm adapter folder or "
        "with --fuse a fused model (LoRA runs) (default: hf for a LoRA run, else onnx)",
    )
    parser.add_argument(
        "--out",
        help="output folder (default: <run>/onnx or onnx-int8, <run>/merged, <run>/gguf-<quant>, "
        "<run>/mlx or <run>/mlx-fused[-<quant>])",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace --out even when it holds files no export wrote (never the model being read)",
    )
    parser.add_argument(
        "--quant",
        default=None,
        help="onnx: int8 (default: float32); gguf: f16, q8_0 or q4_0 (default: f16); mlx with "
        "--fuse: 4bit or 8bit (default: the base's dtype)",
    )
    options: dict[str, tuple[Any, list[str]]] = {}  # a family's option: its default, formats
    for family in families:
        known = {action.dest for action in parser._actions}
        family.add_export_arguments(parser)
        for action in parser._actions:
            if action.dest not in known:
                options[action.dest] = (action.default, list(family.FORMATS))
    parser.set_defaults(format_options=options)


def exporting_families() -> list[Exports]:
    """The exports modules of the installed families that have one, and of the clone's
    ``user/`` families."""
    from laptrain.project import ProjectNotFound, project_root

    try:
        project: Path | None = project_root()
    except ProjectNotFound:
        project = None
    return [f.exports() for f in installed_families(project) if f.exports is not None]


def add_parser(commands: Any) -> None:
    """``laptrain export`` in the CLI's parser."""
    add_arguments(
        commands.add_parser(
            "export",
            help="export a run: onnx (any run), a merged transformers folder or a GGUF (LoRA)",
        ),
        exporting_families(),
    )
