"""The ``laptrain`` console script: ``laptrain doctor [--json] [hardware=<profile>] [model=<name>]``.

``laptrain-train`` runs the repository's ``train.py`` (Hydra's entry point stays a plain script so
``python train.py`` and the console script behave the same).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path

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
    report = run_doctor(name, environ=exported, machine=machine, params=params)
    print(report.to_json() if args.json else report.text())
    return 0 if report.ready else 1


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
    args = parser.parse_args(argv)
    return doctor(args)


if __name__ == "__main__":
    sys.exit(main())
