"""The LoRA family's ``laptrain`` commands (its ``FAMILY.commands``): ``laptrain generate`` and
``eval`` of a LoRA run or adapter folder, and its ``laptrain export`` formats (its
``FAMILY.exports``: ``FORMATS`` and :func:`add_export_arguments`). This module is their arguments and the
one-line errors; the work is ``laptrain.families.lora.tools`` (``preference_eval`` for DPO runs,
``laptrain.families.lora.gguf`` for ``--format gguf``, ``mlx_export`` for ``--format mlx``),
imported when a command runs, so that building the parser imports no torch.

``laptrain/commands/cli.py`` adds the parsers (:func:`add_commands`) and maps each command to its
function (``COMMANDS``); ``laptrain/commands/export.py`` dispatches ``--format`` to ``FORMATS``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from laptrain.commands.arguments import add_run_argument
from laptrain.console import quiet_libraries
from laptrain.exit_codes import error_exit_code
from laptrain.run_folder.listing import resolve_run


def lora_command(args: argparse.Namespace) -> int:
    """``export``, ``generate`` and ``eval`` of a LoRA adapter (laptrain.families.lora.tools)."""
    import laptrain.families.lora.tools as lora_tools
    from laptrain.console import no_transformers_bars

    quiet_libraries()
    try:
        args.path = resolve_run(args.path, args.root, any_folder=True)
        with no_transformers_bars():
            return _lora_command(args, lora_tools)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return error_exit_code(err)  # 2, or a base that does not fit memory


def _lora_command(args: argparse.Namespace, lora_tools: Any) -> int:
    where = {"device": args.device, "dtype": args.dtype}
    if args.command == "export" and args.fuse and args.format != "mlx":
        raise ValueError("--fuse is for --format mlx: add --format mlx, or drop --fuse")
    if args.command == "export" and args.format == "mlx":
        _export_mlx(args)
    elif args.command == "export" and args.format == "gguf":
        from laptrain.families.lora.gguf.write import export_gguf

        if args.dtype is not None:
            raise ValueError(
                "--dtype is for --format hf: a GGUF is merged in float32, then --quant"
            )
        done = export_gguf(
            args.path, args.out, args.quant or "f16", device=args.device, force=args.force
        )
        print(f"GGUF ({done.quant}, {done.bytes / 1024**2:.1f} MiB) written to {done.file}")
        print(f"Ollama: ollama create NAME -f {done.folder / 'Modelfile'}")
    elif args.command == "export":
        if args.quant is not None:
            raise ValueError("--quant is for --format gguf or mlx: add --format, or drop --quant")
        out = lora_tools.export_merged(args.path, args.out, **where, force=args.force)
        print(f"merged model written to {out}")
    elif args.command == "generate":
        model, tokenizer = lora_tools.load_for_generation(args.path, **where)
        lora_tools.generate(
            model,
            tokenizer,
            args.prompt,
            max_new_tokens=args.max_new_tokens,
            system_prompt=args.system,
            temperature=args.temperature,
        )
        print()
    elif args.tasks is not None:
        _eval_tasks(args)
    elif args.data is None:
        raise ValueError("eval needs --data FILE (loss, perplexity) or --tasks T1,T2 (lm-eval)")
    else:
        result = lora_tools.evaluate(
            args.path, args.data, args.max_length, args.batch_size, **where
        )
        print(result.markdown())
    return 0


def _export_mlx(args: argparse.Namespace) -> None:
    """``laptrain export RUN --format mlx [--fuse] [--quant 4bit|8bit]`` (mlx_export)."""
    from laptrain.families.lora.mlx_export import export_mlx

    if args.dtype is not None or args.device is not None:
        raise ValueError(
            "--dtype and --device are for --format hf: an MLX export keeps the base's dtype "
            "(--fuse --quant 4bit|8bit quantizes it) and mlx-lm picks its own device"
        )
    done = export_mlx(args.path, args.out, args.fuse, args.quant, args.force)
    print(f"{done.what} written to {done.folder}")
    print(f"run it: {done.run_it}")


def _eval_tasks(args: argparse.Namespace) -> None:
    """``laptrain eval RUN --tasks``: lm-evaluation-harness accuracy, adapter vs base."""
    import json
    import logging

    if args.data is not None:
        raise ValueError("--data and --tasks are two evaluations: give one of them")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit {args.limit}: give at least 1 item per task, or drop --limit")
    if args.dtype not in (None, "float32"):
        raise ValueError("--dtype is for --data: --tasks scores in float32, as lm_eval does")
    if args.max_length is not None:
        raise ValueError("--max-length is for --data: lm-eval's tasks set their own lengths")
    from laptrain.families.lora.harness import evaluate_tasks, table

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise ValueError("--tasks is empty: name lm-eval tasks, e.g. --tasks stdlib_mc")
    logging.getLogger("lm_eval").setLevel(logging.WARNING)  # its INFO lines per task and load
    scores = evaluate_tasks(
        args.path, tasks, args.include_path, args.limit, args.base, args.batch_size, args.device
    )
    print(json.dumps(scores, indent=1) if args.json else table(scores))


def _add_load_options(parser: argparse.ArgumentParser, export: bool = False) -> None:
    """``--device`` and ``--dtype``: where and how the base is loaded (default: as the run did)."""
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda", "mps"),
        default=None,
        help="load the base here (default: the device the run trained on when this machine has "
        "it, else cpu, said in one line)",
    )
    if export:
        what = (
            "the dtype the base is loaded and the merged model written in (default, or auto: the "
            "run's model.base_dtype; a 4-bit run's: bfloat16 where the device has it)"
        )
    else:
        what = (
            "the base's dtype (default, or auto: the run's model.base_dtype, bfloat16 only where "
            "the device has it; a 4-bit run reloads 4-bit on CUDA with bitsandbytes)"
        )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "auto"),
        default=None,
        help=f"{what}. The base's weights at this dtype must fit the memory budget training would "
        "use on this machine, else one line and exit 69 (does not fit)",
    )


WHERE = "a LoRA run as `laptrain runs` names it, its folder, or an adapter folder"


def add_commands(commands: Any) -> None:
    """``laptrain generate`` and ``eval`` in the CLI's parser."""
    _add_generate(commands)
    _add_eval(commands)


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """LoRA's options of ``laptrain export`` (laptrain.commands.export declares the command)."""
    parser.add_argument(
        "--fuse",
        action="store_true",
        help="with --format mlx: fuse the adapter into the base, a folder mlx_lm.load reads",
    )
    _add_load_options(parser, export=True)


def _add_generate(commands: Any) -> None:
    gen = commands.add_parser("generate", help="reply to a prompt with a LoRA (or merged) model")
    add_run_argument(gen, f"{WHERE}, or a merged model folder", "path")
    gen.add_argument("--prompt", required=True, help="the user's message (required)")
    gen.add_argument(
        "--system", default=None, help="system prompt (default: none, the chat template's own)"
    )
    gen.add_argument(
        "--max-new-tokens", type=int, default=256, help="stop after this many new tokens"
    )
    gen.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature, 0: greedy"
    )
    _add_load_options(gen)


def _add_eval(commands: Any) -> None:
    ev = commands.add_parser(
        "eval",
        help="masked loss/perplexity of base vs adapter on a file; DPO metrics on preference pairs; "
        "lm-evaluation-harness tasks (--tasks)",
    )
    add_run_argument(ev, WHERE, "path")
    ev.add_argument(
        "--data", default=None, help="JSONL/CSV/Parquet rows as in training (or --tasks)"
    )
    ev.add_argument(
        "--tasks",
        default=None,
        help="comma-separated lm-evaluation-harness tasks (pip install 'laptrain[eval]'): each "
        "task's accuracy, written to <run>/eval/lm_eval.json; stdlib_mc ships offline",
    )
    ev.add_argument(
        "--include-path", default=None, help="with --tasks: a folder of your own task YAMLs"
    )
    ev.add_argument(
        "--limit", type=int, default=None, help="with --tasks: the first N items of each task"
    )
    ev.add_argument(
        "--base", action="store_true", help="with --tasks: score the base too (adapter off)"
    )
    ev.add_argument(
        "--json", action="store_true", help="with --tasks: print only {task: {adapter, base}}"
    )
    ev.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="cut each row to this many tokens, from the left (default: whole rows)",
    )
    ev.add_argument("--batch-size", type=int, default=8, help="rows per forward pass")
    _add_load_options(ev)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "generate": lora_command,
    "eval": lora_command,
}
# ``laptrain export --format``s of a LoRA run (its ``FAMILY.exports``); hf, the first, by default
FORMATS: dict[str, Callable[[argparse.Namespace], int]] = {
    "hf": lora_command,
    "gguf": lora_command,
    "mlx": lora_command,
}
