"""``laptrain export RUN --format F``: one command for every format (docs/export.md). The run's
family (from its config's ``_target_``, :mod:`laptrain.family`) exports the formats its
``FAMILY.exports`` names (LoRA: hf, gguf; the classifier: onnx with its tokenizer); any other run,
a user's own LightningModule too, exports as onnx through :mod:`laptrain.commands.onnx_export`.
A folder that is no run (a LoRA adapter folder) goes to the installed family that names the
format. A family's exports module is imported only when its format is asked for, or to add its
options to this parser."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from laptrain.commands.arguments import add_run_argument
from laptrain.exit_codes import error_exit_code
from laptrain.family import Exports, Family, family_of, installed_families
from laptrain.run_folder.listing import resolve_run

GENERIC = "onnx"  # laptrain's own format, for any LightningModule


def _run_family(run: Path) -> Family | None:
    """The family of the run's ``model._target_`` (None: no run config, or no family)."""
    import yaml

    config = run / ".hydra" / "config.yaml"
    if not config.is_file():
        return None
    return family_of((yaml.safe_load(config.read_text()) or {}).get("model"))


def _formats(run: Path) -> tuple[str, dict[str, Callable[[argparse.Namespace], int]]]:
    """What exports ``run`` (a family's name, or "this run") and its formats, in their order:
    its family's, then onnx; a folder that is no run: every installed family's."""
    from laptrain.commands.onnx_export import export_module

    family = _run_family(run)
    if (run / ".hydra").is_dir():
        families = [family] if family is not None else []
    else:
        families = installed_families()
    formats: dict[str, Callable[[argparse.Namespace], int]] = {}
    for found in families:
        if found.exports is not None:
            formats = {**found.exports().FORMATS, **formats}
    what = f"a {family.name} run" if family is not None else "this run"
    return what, {**formats, GENERIC: formats.get(GENERIC, export_module)}


def export_command(args: argparse.Namespace) -> int:
    """Export the run in ``--format`` (default: its family's first format, else onnx)."""
    try:
        args.path = resolve_run(args.path, args.root, any_folder=True)
        what, formats = _formats(args.path)
        args.format = args.format or next(iter(formats))
        if args.format not in formats:
            raise ValueError(
                f"--format {args.format}: {what} exports as {', '.join(formats)}: "
                f"give --format {next(iter(formats))}"
            )
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
        "gguf: model.gguf for llama.cpp, Ollama and LM Studio (LoRA runs) (default: hf for a "
        "LoRA run, else onnx)",
    )
    parser.add_argument(
        "--out",
        help="output folder (default: <run>/onnx or onnx-int8, <run>/merged, or <run>/gguf-<quant>)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace --out even when it holds files no export wrote (never the model being read)",
    )
    parser.add_argument(
        "--quant",
        default=None,
        help="onnx: int8 (default: float32); gguf: f16, q8_0 or q4_0 (default: f16)",
    )
    for family in families:
        family.add_export_arguments(parser)


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
