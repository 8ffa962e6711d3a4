"""laptrain's entry point: `python train.py [group=option ...] [key=value ...]`.

Order matters here: the hardware profile is chosen and its environment variables are exported
before anything imports torch, because torch reads several of them only once (docs/hardware.md).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from laptrain.argv import run_argv_hook
from laptrain.config_check import check_composed, compose_argv
from laptrain.data.labelled_files import check_data_config
from laptrain.hardware.auto import resolve_hardware_argv
from laptrain.hardware.env import EnvReport, apply_env
from laptrain.run_dir import register_resolvers
from laptrain.run_lock import hold_run_folder
from laptrain.scale_out import asks_multirun, check_scale_out

register_resolvers()
CONF = Path(__file__).resolve().parent / "conf"


# Flags that only print Hydra's help or completion: nothing to check or apply.
HELP_FLAGS = {"--help", "-h", "--hydra-help", "--version", "--shell-completion", "-sc"}
# Flags that print the config without training: checked, but any profile may be inspected anywhere.
PRINT_FLAGS = {"--cfg", "-c", "--info", "-i"}
ENV: EnvReport | None = None  # applied once per process, before the config check imports torch


def apply_profile_env(cfg: DictConfig) -> EnvReport:
    """Export the profile's env (refusing MPS watermarks torch would refuse) and print its notes."""
    env = apply_env(cfg.hardware.get("env"))
    for line in env.notes:
        print(line)
    return env


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        env = ENV if ENV is not None else apply_profile_env(cfg)
        from laptrain.run import train  # imports torch: after the env is set

        outcome = train(cfg, env)
    except Exception as err:
        cause = user_error(err)
        if cause is None or os.environ.get("LAPTRAIN_TRACEBACK"):
            raise
        print(f"error: {cause}", file=sys.stderr)
        sys.exit(2)
    if outcome.exit_code:
        sys.exit(outcome.exit_code)
    return outcome.metric


def user_error(err: BaseException) -> BaseException | None:
    """The bad-input error behind ``err`` (Hydra wraps errors raised while instantiating), if any."""
    while err is not None:
        if isinstance(err, ValueError | OSError | ConnectionError):
            return err
        err = err.__cause__
    return None


def resolve_argv(argv: list[str]) -> list[str]:
    """``hardware=auto`` and ``model.size=auto`` resolved on the command line, before Hydra."""
    argv, why = resolve_hardware_argv(argv)
    if why:
        print(why)
    argv, lines = run_argv_hook(argv, CONF)  # e.g. TRM's model.size=auto
    for line in lines:
        print(line)
    return argv


def precheck(argv: list[str]) -> EnvReport | None:
    """Compose the config, check the data files, apply the profile's env, then check every
    ``_target_`` against its constructor, all before Hydra makes a run folder; None for help-only
    commands."""
    if HELP_FLAGS.intersection(argv[1:]):
        return None
    cfg = compose_argv(argv, str(CONF))
    printing = PRINT_FLAGS.intersection(a.split("=", 1)[0] for a in argv[1:])
    if not printing:  # no torch yet: a bad data file is refused in about a second
        check_data_config(cfg.get("data"))
    env = apply_profile_env(cfg)
    check_composed(cfg)
    check_scale_out(cfg, asks_multirun(argv))  # -m with ddp/fsdp re-running the command: refused
    if printing:
        return env  # `--cfg job` on any machine shows what a profile sets; nothing runs
    from laptrain.run import check_device  # imports torch: after the env is set

    check_device(cfg)
    env.device_checked = True
    if not multirun(argv, cfg):  # a sweep's jobs each lock their own folder (laptrain.run)
        hold_run_folder(str(cfg.hydra.run.dir), argv)
    return env


def multirun(argv: list[str], cfg: DictConfig) -> bool:
    return asks_multirun(argv) or str(cfg.hydra.mode) == "MULTIRUN"


if __name__ == "__main__":
    try:
        sys.argv = resolve_argv(sys.argv)
        ENV = precheck(sys.argv)
    except (ValueError, OSError) as err:  # bad input; e.g. an Intel Mac under hardware=auto
        if os.environ.get("LAPTRAIN_TRACEBACK"):
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    main()
