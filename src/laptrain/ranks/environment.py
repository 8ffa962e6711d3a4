"""Which rank this process is, from the launcher's variables (Lightning's, torchrun's, srun's), read
with the standard library only, so the launch may ask before torch is imported."""

from __future__ import annotations

import os
from collections.abc import Mapping


def local_rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's rank on its machine, which is the index of its GPU when trainer.devices is a
    count (Lightning's ``root_device`` is ``parallel_devices[local_rank]``,
    lightning/pytorch/strategies/ddp.py:118-120): ``LOCAL_RANK`` (Lightning's subprocess launcher,
    torchrun), else ``SLURM_LOCALID`` (srun; fabric/plugins/environments/slurm.py:150-151), else 0:
    one process, or rank 0, which builds its model before Lightning's launcher sets any of them."""
    env = os.environ if environ is None else environ
    for key in ("LOCAL_RANK", "SLURM_LOCALID"):
        if env.get(key, "").strip():
            return int(env[key])
    return 0


def extra_rank(environ: Mapping[str, str] | None = None) -> bool:
    """A process of a multi-process launch other than rank 0 (the ranks Lightning's subprocess
    launcher, torchrun or srun start see these variables; rank 0 speaks for all of them)."""
    env = os.environ if environ is None else environ
    return any(
        env.get(key) not in (None, "", "0")
        for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "NODE_RANK")
    )


def started_together(environ: Mapping[str, str] | None = None) -> bool:
    """torchrun (``WORLD_SIZE``) or srun (``SLURM_NTASKS``) started several ranks at once, so no
    rank can hand its choice to the others through the environment. Lightning's own launcher sets
    ``WORLD_SIZE`` only when it starts ranks 1..N-1, after rank 0 has built its model."""
    env = os.environ if environ is None else environ
    return any(_count(env.get(key)) > 1 for key in ("WORLD_SIZE", "SLURM_NTASKS"))


def _count(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0
