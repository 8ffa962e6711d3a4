"""laptrain's entry point: `python train.py [group=option ...] [key=value ...]`.

Order matters here: the hardware profile is chosen and its environment variables are exported
before anything imports torch, because torch reads several of them only once (FACTS.md §1, §2, §6).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from laptrain.hardware.auto import resolve_hardware_argv
from laptrain.hardware.env import apply_env
from laptrain.model.trm.sizing import resolve_size_argv
from laptrain.run_dir import register_resolvers

register_resolvers()
CONF = Path(__file__).resolve().parent / "conf"


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    env = apply_env(cfg.hardware.get("env"))
    try:
        from laptrain.run import train  # imports torch: after the env is set

        return train(cfg, env)
    except Exception as err:
        cause = user_error(err)
        if cause is None or os.environ.get("LAPTRAIN_TRACEBACK"):
            raise
        print(f"error: {cause}", file=sys.stderr)
        sys.exit(2)


def user_error(err: BaseException) -> BaseException | None:
    """The bad-input error behind ``err`` (Hydra wraps errors raised while instantiating), if any."""
    while err is not None:
        if isinstance(err, ValueError | OSError | ConnectionError):
            return err
        err = err.__cause__
    return None


if __name__ == "__main__":
    sys.argv, why = resolve_hardware_argv(sys.argv)
    if why:
        print(why)
    sys.argv, size_lines = resolve_size_argv(sys.argv, str(CONF / "model" / "trm_sudoku.yaml"))
    for line in size_lines:
        print(line)
    main()
