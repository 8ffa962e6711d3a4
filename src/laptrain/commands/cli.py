"""The ``laptrain`` console script; docs/cli.md has every command, its output and exit codes.

Each subcommand is one function of the parsed arguments (``COMMANDS``), its arguments declared in
``PARSERS``; a family's own come from its ``commands`` hook (laptrain.family).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from laptrain.commands.arguments import ROOT_HELP, RUN, add_run_argument
from laptrain.commands.bench import add_arguments as add_bench_arguments
from laptrain.commands.bench import bench_command
from laptrain.commands.export import add_parser as add_export_parser
from laptrain.commands.export import export_command
from laptrain.commands.fetch import add_arguments as add_fetch_arguments
from laptrain.commands.fetch import fetch_command
from laptrain.commands.new import add_arguments as add_new_arguments
from laptrain.commands.new import new_command
from laptrain.console import quiet_libraries
from laptrain.family import Commands, family_of_preset, installed_families
from laptrain.project import ProjectNotFound, conf_dir, project_root, train_script
from laptrain.run_folder.listing import RUNS_ROOT, resolve_run


def configured_model_params(overrides: list[str]) -> int | None:
    """Parameter count of the model the training config would build, on the meta device (no memory);
    None when it needs the data (e.g. sizes the datamodule supplies)."""
    try:
        import torch
        from hydra import compose, initialize_config_dir
        from hydra.utils import instantiate

        from laptrain.run_folder.naming import register_resolvers

        register_resolvers()
        with initialize_config_dir(str(conf_dir()), version_base="1.3"):
            cfg = compose("train", overrides=[o for o in overrides if o.startswith("model")])
        with torch.device("meta"):
            model = instantiate(cfg.model, num_labels=2, _convert_="all")
        return sum(p.numel() for p in model.parameters())
    except Exception:  # noqa: BLE001 - a model that needs its data cannot be sized here
        return None


def doctor(args: argparse.Namespace) -> int:
    from laptrain.commands.doctor import run_doctor
    from laptrain.hardware.detect import detect_machine, read_raw_machine
    from laptrain.hardware.env import apply_env
    from laptrain.hardware.profile import ProfileError, load_profile

    quiet_libraries()  # Lightning's tips and known warnings, as a run holds them back
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
    family = family_of_preset(overrides.get("model"), conf_dir())  # the family's own check
    report = run_doctor(name, environ=exported, machine=machine, params=params, family=family)
    print(report.to_json() if args.json else report.text())
    return report.exit_code


def run_train_script(overrides: list[str]) -> int:
    """Run train.py with ``overrides`` as its command line, in this process, as ``python train.py``
    would: the same hardware=auto resolution, precheck and exit codes (train.py exits non-zero)."""
    script = train_script()
    sys.argv = [str(script), *overrides]
    runpy.run_path(str(script), run_name="__main__")
    return 0


def train_main() -> None:
    """``laptrain-train [overrides]``: the same as ``laptrain train [overrides]``."""
    sys.exit(main(["train", *sys.argv[1:]]))


def train(args: argparse.Namespace) -> int:
    return run_train_script(args.overrides)


def runs_json(states: list[Any], root: Path) -> str:
    """``laptrain runs --json``: the table's rows as one JSON document."""
    rows = []
    for s in states:
        metric, _, score = (s.best or "").rpartition(" ")
        rows.append(
            {
                "name": s.folder.relative_to(root).as_posix()
                if s.folder.is_relative_to(root)
                else str(s.folder),
                "folder": str(s.folder),
                "status": s.status,
                "step": s.step,
                "best_metric": metric or None,
                "best_score": float(score) if metric else None,
                "evaluated": s.evaluated,
                "command": s.command,
            }
        )
    return json.dumps({"root": str(root), "runs": rows}, indent=1)


def runs(args: argparse.Namespace) -> int:
    """The table of run folders under ``--root``; ``compare`` and ``clean`` of named runs."""
    from laptrain.run_folder.listing import find_runs, run_state, runs_table

    if args.runs_command == "compare":
        from laptrain.run_folder.compare import compare_command

        return compare_command(args.runs, args.root, args.out)
    if args.runs_command == "summary":
        from laptrain.run_folder.summary import summary_command

        return summary_command(args.runs, args.root, args.json)
    if args.runs_command == "clean":
        from laptrain.run_folder.clean import clean_command

        return clean_command(args.runs, args.root, args.dry_run)
    root = Path(args.root)
    folders = find_runs(root)
    if args.json:
        print(runs_json([run_state(f) for f in folders], root))
        return 0
    if not folders:
        print(f"no runs under {root}/ (python train.py starts one)")
        return 0
    print(runs_table([run_state(f) for f in folders], root))
    return 0


def why(args: argparse.Namespace) -> int:
    """A few lines on what happened in a run, each with its step and value, and what to change."""
    from laptrain.commands.why import why_json, why_lines

    try:
        folder = resolve_run(args.run, args.root, any_folder=True)
        print(json.dumps(why_json(folder), indent=1) if args.json else "\n".join(why_lines(folder)))
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def checkpoint(args: argparse.Namespace) -> int:
    from laptrain.run_folder.checkpoint_request import checkpoint_command

    return checkpoint_command(args.run, args.root, args.wait)


def preflight(args: argparse.Namespace) -> int:
    """The estimate; 0 when the job fits, ``DOES_NOT_FIT_EXIT`` when not, 2 on bad input."""
    from laptrain.config.check import ConfigError
    from laptrain.preflight.from_config import PreflightInputError, preflight_report

    try:
        lines, fits = preflight_report(args.overrides)
    except (PreflightInputError, ConfigError, OSError) as err:
        print(f"error: {err}".splitlines()[0], file=sys.stderr)
        return 2
    code = 0
    if not fits:
        from laptrain.exit_codes import DOES_NOT_FIT_EXIT

        code = DOES_NOT_FIT_EXIT
    print(
        json.dumps(preflight_json(lines, fits, code), indent=1) if args.json else "\n".join(lines)
    )
    return code


def preflight_json(lines: list[str], fits: bool, code: int) -> dict[str, Any]:
    """``laptrain preflight --json``: the verdict, the chosen estimate and the budget in GiB
    (2^30 bytes, as the lines print them), the budget's source, the fixes, and every line."""
    numbers = {"estimate_gib": None, "budget_gib": None, "budget_source": None}
    for line in lines:
        verdict = re.match(r"(?:fits|does not fit): ([\d.]+) GiB of ([\d.]+) GiB", line)
        if verdict:
            numbers["estimate_gib"], numbers["budget_gib"] = map(float, verdict.groups())
        source = re.match(r"budget: [\d.]+ GiB from (.+)", line)
        if source:
            numbers["budget_source"] = source.group(1)
    fixes = [line.removeprefix("  - ") for line in lines if line.startswith("  - ")]
    return {"fits": fits, "exit_code": code, **numbers, "fixes": fixes, "lines": lines}


def _add_train(commands: Any) -> None:
    trainer = commands.add_parser(
        "train",
        help="train: the same as `python train.py [overrides]` (`laptrain train --help`: Hydra's)",
        add_help=False,  # --help, --cfg job, -m ... all go to train.py
        prefix_chars="\0",
    )
    trainer.add_argument(
        "overrides",
        nargs=argparse.REMAINDER,
        help="train.py's whole command line, handed over untouched: Hydra's overrides and "
        "options (default: none, conf/train.yaml as it is)",
    )


def _add_runs(commands: Any) -> None:
    listing = commands.add_parser(
        "runs", help="the runs under outputs/: status, step, best score, command to resume"
    )
    listing.add_argument("--root", default=RUNS_ROOT, help=ROOT_HELP)
    listing.add_argument(
        "--json", action="store_true", help="print the runs as one JSON document (as doctor --json)"
    )
    _add_runs_commands(
        listing.add_subparsers(
            dest="runs_command",
            metavar="{compare,summary,clean}",
            help="compare, summarise or clean named runs (default: list every run)",
        )
    )


def _add_why(commands: Any) -> None:
    explain = commands.add_parser(
        "why", help="what happened in a run (NaN, plateau, divergence, overfitting, slowdown, OOM)"
    )
    add_run_argument(explain)
    explain.add_argument(
        "--json", action="store_true", help="print the findings as one JSON document"
    )


def _add_checkpoint(commands: Any) -> None:
    save = commands.add_parser(
        "checkpoint",
        help="make a running job write last.ckpt at its next step boundary and go on",
    )
    add_run_argument(save, f"a running job: {RUN}")
    save.add_argument(
        "--wait",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long to wait for the run's answer, 0: ask and return (default: %(default)s)",
    )


def _add_runs_commands(commands: Any) -> None:
    """``laptrain runs compare``, ``summary`` and ``clean`` (plain ``laptrain runs`` lists)."""
    named = "runs as `laptrain runs` names them (e.g. tiny_classifier-text_csv), or run folders"
    # SUPPRESS: `laptrain runs --root x compare ...` keeps x (a default here would override it)
    root = {
        "default": argparse.SUPPRESS,
        "help": f"where runs live (default: the --root before the verb, else {RUNS_ROOT})",
    }
    compare = commands.add_parser(
        "compare",
        help="config differences, final and best metrics, speed, memory and wall time side "
        "by side; a PNG of the validation curves",
    )
    compare.add_argument("runs", nargs="+", metavar="RUN", help=f"two or more {named}")
    compare.add_argument(
        "--out", default="runs_compare.png", help="the plot of the validation curves (PNG)"
    )
    compare.add_argument("--root", **root)
    summary = commands.add_parser(
        "summary",
        help="the runs that differ only in data.fold (a k-fold sweep): each metric as mean ± std",
    )
    summary.add_argument(
        "runs", nargs="+", metavar="RUN", help=f"a sweep's folder (e.g. multirun/NAME), or {named}"
    )
    summary.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON document"
    )
    summary.add_argument("--root", **root)
    clean = commands.add_parser(
        "clean", help="remove the named runs (never a live one) and show the space freed"
    )
    clean.add_argument("runs", nargs="+", metavar="RUN", help=named)
    clean.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")
    clean.add_argument("--root", **root)


def _add_doctor(commands: Any) -> None:
    check = commands.add_parser("doctor", help="check that this machine is ready to train")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument(
        "--record",
        metavar="DIR",
        help="also write this machine's raw outputs to DIR (default: write none)",
    )
    check.add_argument(
        "overrides",
        nargs="*",
        help="hardware=<profile> (default: auto), model=<name> (default: none: no LoRA check)",
    )


def _add_preflight(commands: Any) -> None:
    estimate = commands.add_parser(
        "preflight", help="memory estimate of a causal-LM LoRA job from config.json alone"
    )
    estimate.add_argument(
        "--json", action="store_true", help="print the estimate as one JSON document"
    )
    estimate.add_argument(
        "overrides",
        nargs="*",
        help="train.py overrides: model=..., hardware=..., data=..., key=value (default: none, "
        "conf/train.yaml as it is)",
    )


# laptrain's own commands, in `laptrain --help` order; the families' follow them
PARSERS: dict[str, Callable[[Any], None]] = {
    "train": _add_train,
    "runs": _add_runs,
    "why": _add_why,
    "checkpoint": _add_checkpoint,
    "doctor": _add_doctor,
    "preflight": _add_preflight,
    "bench": lambda commands: add_bench_arguments(
        commands.add_parser(
            "bench", help="time N steps of your training job: speed, memory, CPU, advice"
        )
    ),
    "fetch": lambda commands: add_fetch_arguments(
        commands.add_parser(
            "fetch", help="put a model's pretrained weights in the cache; no model: list the cache"
        )
    ),
    "export": add_export_parser,
    "new": lambda commands: add_new_arguments(
        commands.add_parser(
            "new", help="write your own model, data, presets and a test under user/NAME/"
        )
    ),
}


def family_commands(project: Path | None = None) -> list[Commands]:
    """The modules of the families' own commands (each ``FAMILY.commands``, installed or in the
    project's ``user/``), in family-name order; ``laptrain --help`` lists them after laptrain's."""
    return [f.commands() for f in installed_families(project) if f.commands is not None]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each argument's default: argparse's ``(default: X)`` where the help does not already
    say it, left off where there is nothing to show (no value, a flag that is off)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or any(action.default is v for v in (None, False, argparse.SUPPRESS)):
            return text  # `is`: a default of 0 or 0.0 is shown
        return super()._get_help_string(action) or text


class Parser(argparse.ArgumentParser):
    """Options and positionals in any order (``laptrain bench a=1 --steps 20 b=2``) through
    argparse's ``parse_known_intermixed_args``, except with subcommands or ``REMAINDER``."""

    _mixing = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        mixable = not any(
            a.nargs in (argparse.PARSER, argparse.REMAINDER) for a in self._get_positional_actions()
        )
        if self._mixing or not mixable:  # argparse's intermixed parse calls this method twice
            return super().parse_known_args(args, namespace)
        self._mixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._mixing = False


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("laptrain")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return "unknown (not installed)"


def build_parser(families: list[Commands] | None = None) -> argparse.ArgumentParser:
    """Every subcommand's arguments, the ``families``' included (default: the installed ones)."""
    parser = Parser(
        prog="laptrain",
        description="laptrain: train, inspect and use runs (docs/cli.md)",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"laptrain {package_version()}",
        help="print the installed laptrain's version and exit",
    )
    commands = parser.add_subparsers(
        dest="command",
        required=True,
        help="the command (required); `laptrain COMMAND --help`: its options",
    )
    for add in PARSERS.values():
        add(commands)
    for family in family_commands() if families is None else families:
        family.add_commands(commands)
    return parser


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "train": train,
    "runs": runs,
    "why": why,
    "checkpoint": checkpoint,
    "doctor": doctor,
    "preflight": preflight,
    "bench": bench_command,
    "fetch": fetch_command,
    "export": export_command,
    "new": new_command,
}


def command_table(families: list[Commands]) -> dict[str, Callable[[argparse.Namespace], int]]:
    return {**COMMANDS, **{name: run for f in families for name, run in f.COMMANDS.items()}}


def import_from_clone() -> Path | None:
    """Puts the clone's root first on ``sys.path``, as ``python train.py`` has it, so that
    ``_target_: user.<name>...`` imports (docs/your_model.md); the root, None outside a clone."""
    try:
        root = project_root()
    except ProjectNotFound:
        return None
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return root


def main(argv: list[str] | None = None) -> int:
    families = family_commands(import_from_clone())
    args = build_parser(families).parse_args(argv)
    try:
        return command_table(families)[args.command](args)
    except ProjectNotFound as err:  # a plain `pip install .` run outside the clone
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
