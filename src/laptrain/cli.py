"""The ``laptrain`` console script: ``laptrain doctor [--json] [hardware=<profile>] [model=<name>]``,
``laptrain preflight model=<lora model> hardware=<profile> [key=value ...]`` (a causal-LM LoRA
job's memory estimate from config.json alone), and ``laptrain export|generate|eval <run or adapter
folder>`` for LoRA adapters.

``laptrain-train`` runs the repository's ``train.py`` (Hydra's entry point stays a plain script so
``python train.py`` and the console script behave the same).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path
from typing import Any

from laptrain.hardware.profile import conf_dir


def configured_model_params(overrides: list[str]) -> int | None:
    """Parameter count of the model the training config would build (on the meta device: no memory).

    None when it cannot be known without data (e.g. the datamodule supplies required sizes).
    """
    try:
        import torch
        from hydra import compose, initialize_config_dir
        from hydra.utils import instantiate

        from laptrain.run_dir import register_resolvers

        register_resolvers()
        with initialize_config_dir(str(conf_dir()), version_base="1.3"):
            cfg = compose("train", overrides=[o for o in overrides if o.startswith("model")])
        with torch.device("meta"):
            model = instantiate(cfg.model, num_labels=2, _convert_="all")
        return sum(p.numel() for p in model.parameters())
    except Exception:  # noqa: BLE001 - a model that needs its data cannot be sized here
        return None


def is_causal_lm_lora(model: str | None) -> bool:
    """Whether ``model=<name>`` names a causal-LM LoRA config (conf/model/<name>.yaml)."""
    if not model:
        return False
    path = conf_dir() / "model" / f"{model}.yaml"
    if not path.is_file():
        return False
    from omegaconf import OmegaConf

    target = OmegaConf.load(path).get("_target_")
    return target == "laptrain.model.causal_lm_lora.CausalLMLoRAModule"


def doctor(args: argparse.Namespace) -> int:
    from laptrain.doctor import run_doctor
    from laptrain.hardware.detect import detect_machine, read_raw_machine
    from laptrain.hardware.env import apply_env
    from laptrain.hardware.profile import ProfileError, load_profile

    if args.record:
        read_raw_machine().write_dir(args.record)
        print(f"machine outputs written to {args.record}")
    overrides = dict(o.split("=", 1) for o in args.overrides if "=" in o)
    unknown = [
        o for o in args.overrides if "=" not in o or o.split("=", 1)[0] not in ("hardware", "model")
    ]
    if unknown:
        print(
            f"error: unknown argument {unknown[0]!r}: use hardware=<profile> or model=<name>",
            file=sys.stderr,
        )
        return 2
    exported = dict(os.environ)
    machine = detect_machine()
    name = overrides.get("hardware", "auto")
    try:
        from laptrain.hardware.auto import choose_profile

        profile = load_profile(choose_profile(machine).profile if name == "auto" else name)
        apply_env(profile.get("env"))  # before torch loads, as train.py does; your exports win
    except ProfileError:
        pass  # run_doctor reports the bad profile
    params = configured_model_params(
        [f"model={overrides['model']}"] if "model" in overrides else []
    )
    report = run_doctor(
        name,
        environ=exported,
        machine=machine,
        params=params,
        lora=is_causal_lm_lora(overrides.get("model")),
    )
    print(report.to_json() if args.json else report.text())
    return 0 if report.ready else 1


def lora_command(args: argparse.Namespace) -> int:
    """``export``, ``generate`` and ``eval`` of a LoRA adapter (laptrain.lora_tools)."""
    from laptrain import lora_tools

    try:
        if args.command == "export":
            out = lora_tools.export_merged(args.path, args.out, args.dtype)
            print(f"merged model written to {out}")
        elif args.command == "generate":
            model, tokenizer = lora_tools.load_for_generation(args.path)
            lora_tools.generate(
                model,
                tokenizer,
                args.prompt,
                max_new_tokens=args.max_new_tokens,
                system_prompt=args.system,
                temperature=args.temperature,
            )
            print()
        else:
            result = lora_tools.evaluate(args.path, args.data, args.max_length, args.batch_size)
            print(result.markdown())
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _add_lora_commands(commands: Any) -> None:
    where = "a LoRA run folder or adapter folder"
    export = commands.add_parser("export", help="merge a LoRA adapter into its base model")
    export.add_argument("path", help=where)
    export.add_argument("--out", help="output folder (default <run>/merged or <adapter>-merged)")
    export.add_argument("--dtype", default="float32", help="float32, bfloat16 or auto (the base's)")
    gen = commands.add_parser("generate", help="reply to a prompt with a LoRA (or merged) model")
    gen.add_argument("path", help=f"{where}, or a merged model folder")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--system", default=None, help="system prompt")
    gen.add_argument("--max-new-tokens", type=int, default=256)
    gen.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    ev = commands.add_parser("eval", help="masked loss/perplexity of base vs adapter on a file")
    ev.add_argument("path", help=where)
    ev.add_argument("--data", required=True, help="JSONL/CSV/Parquet rows as in training")
    ev.add_argument("--max-length", type=int, default=None)
    ev.add_argument("--batch-size", type=int, default=8)


def train_main() -> None:
    """``laptrain-train [overrides]``: run the repository's train.py as ``python train.py`` would."""
    script = Path(__file__).resolve().parents[2] / "train.py"
    if not script.is_file():
        sys.exit(
            f"error: {script} not found: laptrain-train needs an editable install of the repository "
            "(pip install -e .); otherwise run `python train.py` in the repository"
        )
    sys.argv = [str(script), *sys.argv[1:]]
    runpy.run_path(str(script), run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="laptrain", description="laptrain tools")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("doctor", help="check that this machine is ready to train")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument(
        "--record", metavar="DIR", help="also write this machine's raw outputs to DIR"
    )
    check.add_argument(
        "overrides", nargs="*", help="hardware=<profile> (default auto), model=<name>"
    )
    estimate = commands.add_parser(
        "preflight", help="memory estimate of a causal-LM LoRA job from config.json alone"
    )
    estimate.add_argument(
        "overrides",
        nargs="*",
        help="train.py overrides: model=..., hardware=..., data=..., key=value",
    )
    _add_lora_commands(commands)
    args = parser.parse_args(argv)
    if args.command == "preflight":
        from laptrain.preflight.from_config import preflight_main

        return preflight_main(args.overrides)
    if args.command in ("export", "generate", "eval"):
        return lora_command(args)
    return doctor(args)


if __name__ == "__main__":
    sys.exit(main())
