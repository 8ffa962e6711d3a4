"""The versions a run, a report or a bug report names: one list, read from package metadata
without importing the packages."""

from __future__ import annotations

import platform
from importlib import metadata

# name shown -> distribution name on PyPI (they differ for Hydra)
PACKAGES: dict[str, str] = {
    "laptrain": "laptrain",
    "torch": "torch",
    "lightning": "lightning",
    "torchmetrics": "torchmetrics",
    "transformers": "transformers",
    "tokenizers": "tokenizers",
    "peft": "peft",
    "hydra": "hydra-core",
    "omegaconf": "omegaconf",
}


def package_versions() -> dict[str, str]:
    """``python`` and the installed version of each package in ``PACKAGES``; missing ones are left out."""
    found = {"python": platform.python_version()}
    for shown, distribution in PACKAGES.items():
        try:
            found[shown] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return found
