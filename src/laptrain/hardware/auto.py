"""Resolve ``hardware=auto`` to a concrete profile before Hydra composes the config.

The launcher rewrites ``hardware=auto`` (or no ``hardware=`` at all) on the command line into
``hardware=<profile>``, so that the chosen profile's ``env:`` is applied before torch is imported,
user overrides of ``hardware.*`` still apply, and ``--cfg job`` shows the real values.
Detection here must not import torch.
"""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path


def detect_profile() -> tuple[str, str]:
    """Return (profile name, one-line reason) for this machine, without importing torch."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) != "" and (
        Path("/proc/driver/nvidia/gpus").is_dir() or shutil.which("nvidia-smi")
    ):
        return "cuda", "NVIDIA driver found"
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return "mps", "Apple Silicon Mac"
    return "cpu", f"no GPU found ({platform.system()} {platform.machine()})"


def resolve_hardware_argv(argv: list[str]) -> tuple[list[str], str | None]:
    """Return argv with ``hardware=auto`` replaced by the detected profile, and a line saying why.

    Leaves argv alone (and returns ``None``) when the user chose a profile.
    """
    args = list(argv)
    positions = [i for i, a in enumerate(args) if a.split("=", 1)[0] in ("hardware", "+hardware")]
    if positions and args[positions[-1]].split("=", 1)[1] != "auto":
        return args, None
    name, reason = detect_profile()
    choice = f"hardware={name}"
    if positions:
        args[positions[-1]] = choice
    else:
        args.append(choice)
    return args, f"hardware=auto: {reason} -> {name}"
