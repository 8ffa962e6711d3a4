"""The launch sequence shared by ``train.py`` and ``laptrain bench``: resolve argv, compose, check
the data, export the profile's environment, check the targets; ``train.py`` then checks the device
and locks the run folder. Nothing here imports torch before the environment is exported."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from omegaconf import DictConfig

from laptrain.config.check import check_composed, compose_argv
from laptrain.config.overrides import run_argv_hook
from laptrain.data.precheck import check_data_config
from laptrain.hardware.auto import resolve_hardware_argv
from laptrain.hardware.env import EnvReport, apply_env
from laptrain.hardware.malloc import keep_freed
from laptrain.ranks.processes import asks_multirun, check_scale_out
from laptrain.run_folder.lock import hold_run_folder

if TYPE_CHECKING:
    from laptrain.launch.device import RunDevice

# Flags that only print Hydra's help or completion: nothing to check or apply.
HELP_FLAGS = {"--help", "-h", "--hydra-help", "--version", "--shell-completion", "-sc"}
# Flags that print the config without training: checked, but any profile may be inspected anywhere.
PRINT_FLAGS = {"--cfg", "-c", "--info", "-i"}


def resolve_argv(argv: Sequence[str], conf: Path, say: Callable[[str], None] = print) -> list[str]:
    """``hardware=auto`` and argv hooks (e.g. TRM's ``model.size=auto``) resolved, before Hydra."""
    resolved, why = resolve_hardware_argv(list(argv))
    if why:
        say(why)
    resolved, lines = run_argv_hook(resolved, conf)
    for line in lines:
        say(line)
    return resolved


def apply_profile_env(cfg: DictConfig, say: Callable[[str], None] = print) -> EnvReport:
    """Export the profile's env (refusing MPS watermarks torch would refuse) and print its notes;
    apply its ``malloc_keep_freed`` (glibc's mallopt, before any model is built)."""
    env = apply_env(cfg.hardware.get("env"))
    keep_freed(cfg.hardware.get("malloc_keep_freed"))
    for line in env.notes:
        say(line)
    return env


def compose_checked(
    argv: Sequence[str],
    conf: Path,
    check_data: bool = True,
    say: Callable[[str], None] = print,
) -> tuple[DictConfig, EnvReport]:
    """The composed config, its data files checked (no torch yet: a bad file is refused in about
    a second), the profile's env exported, then every ``_target_`` checked against its
    constructor. Raises ValueError/OSError with one line on bad input."""
    cfg = compose_argv(argv, str(conf))
    if check_data:
        check_data_config(cfg.get("data"))
    env = apply_profile_env(cfg, say)
    check_composed(cfg)
    return cfg, env


def multirun(argv: Sequence[str], cfg: DictConfig) -> bool:
    """Whether this command runs a sweep (``-m`` or ``hydra.mode=MULTIRUN``)."""
    return asks_multirun(argv) or str(cfg.hydra.mode) == "MULTIRUN"


class Launch(NamedTuple):
    """What the launch hands the job: the environment exported, the device decided (None: print
    only)."""

    env: EnvReport
    device: RunDevice | None


def prepare(argv: Sequence[str], conf: Path) -> Launch | None:
    """``train.py``'s launch, all before Hydra makes a run folder; None for help-only commands.
    ``argv`` is already resolved (:func:`resolve_argv`)."""
    if HELP_FLAGS.intersection(argv[1:]):
        return None
    printing = bool(PRINT_FLAGS.intersection(a.split("=", 1)[0] for a in argv[1:]))
    cfg, env = compose_checked(argv, conf, check_data=not printing)
    check_scale_out(cfg, asks_multirun(argv))  # -m with ddp/fsdp re-running the command: refused
    if printing:
        return Launch(env, None)  # `--cfg job` on any machine shows what a profile sets
    from laptrain.launch.device import decide_device  # imports torch: after the env is set

    device = decide_device(cfg)
    if not multirun(argv, cfg):  # a sweep's jobs each lock their own folder (laptrain.job.run)
        hold_run_folder(str(cfg.hydra.run.dir), list(argv))
    return Launch(env, device)


def user_error(err: BaseException | None) -> BaseException | None:
    """The bad-input error behind ``err`` (Hydra wraps errors raised while instantiating), if any."""
    while err is not None:
        if isinstance(err, ValueError | OSError | ConnectionError):
            return err
        err = err.__cause__
    return None
