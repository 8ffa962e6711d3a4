"""laptrain's entry point: `python train.py [group=option ...] [key=value ...]`.

Order matters here: the hardware profile is chosen and its environment variables are exported
before anything imports torch, because torch reads several of them only once (docs/hardware.md).
That launch sequence lives in ``laptrain.launch.prepare``; this file keeps Hydra's entry.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from laptrain.launch.prepare import Launch, apply_profile_env, prepare, resolve_argv, user_error
from laptrain.run_folder.naming import register_resolvers

register_resolvers()
CONF = Path(__file__).resolve().parent / "conf"
# the env applied and the device decided once per process, before the config check imports torch
LAUNCH: Launch | None = None


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        env = LAUNCH.env if LAUNCH is not None else apply_profile_env(cfg)
        from laptrain.job.run import train  # imports torch: after the env is set

        outcome = train(cfg, env, LAUNCH.device if LAUNCH is not None else None)
    except Exception as err:
        cause = user_error(err)
        if cause is None or os.environ.get("LAPTRAIN_TRACEBACK"):
            raise
        print(f"error: {cause}", file=sys.stderr)
        from laptrain.exit_codes import error_exit_code

        sys.exit(error_exit_code(cause))  # 2; a job that does not fit and a NaN stop their own
    if outcome.status == "pruned":
        from laptrain.callbacks.trial_pruning import raise_in_sweep

        raise_in_sweep()  # the sweeper records a PRUNED trial; sys.exit would end the sweep
    if outcome.exit_code:
        from laptrain.callbacks.graceful_stop import hand_over_to_submitit

        hand_over_to_submitit(outcome.exit_code)  # stopped for submitit's signal: it requeues
        sys.exit(outcome.exit_code)
    return outcome.metric


if __name__ == "__main__":
    try:
        sys.argv = resolve_argv(sys.argv, CONF)
        LAUNCH = prepare(sys.argv, CONF)
    except (ValueError, OSError) as err:  # bad input; e.g. an Intel Mac under hardware=auto
        if os.environ.get("LAPTRAIN_TRACEBACK"):
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    main()
