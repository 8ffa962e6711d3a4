"""Hardware profiles as data: ``conf/hardware/*.yaml`` read without Hydra (their ``defaults``
followed within the group), for the launcher and ``laptrain doctor``, and what they may ask for.
No torch import (docs/hardware.md §2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from laptrain.project import conf_dir

PRECISION_ALIASES = {"16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true"}
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true")


class ProfileError(ValueError):
    """A profile asks for something this device cannot do; the message names the option to change."""


def profile_names(root: Path | None = None) -> list[str]:
    return sorted(p.stem for p in ((root or conf_dir()) / "hardware").glob("*.yaml"))


def load_profile(name: str, root: Path | None = None) -> dict[str, Any]:
    """A profile as a plain dict, with the group-relative ``defaults`` it names merged in first."""
    from omegaconf import OmegaConf

    path = (root or conf_dir()) / "hardware" / f"{name}.yaml"
    if not path.is_file():
        choices = ", ".join(profile_names(root))
        raise ProfileError(f"no hardware profile {name!r}: use hardware=<one of {choices}>")
    node = OmegaConf.load(path)
    defaults = list(node.pop("defaults", []) or [])
    merged = OmegaConf.create({})
    for entry in defaults or ["_self_"]:
        part = node if entry == "_self_" else OmegaConf.create(load_profile(str(entry), root))
        merged = OmegaConf.merge(merged, part)
    if "_self_" not in defaults:
        merged = OmegaConf.merge(merged, node)
    return OmegaConf.to_container(merged, resolve=False)  # type: ignore[return-value]


def normalize_precision(precision: object) -> str:
    """Lightning's spelling of a precision flag ("16" -> "16-mixed"); refuses unknown ones."""
    text = PRECISION_ALIASES.get(str(precision), str(precision))
    if text not in PRECISIONS:
        raise ProfileError(
            f"unknown precision {precision!r}: set hardware.precision to one of {', '.join(PRECISIONS)}"
        )
    return text


def fused_optimizer_unsafe(kind: str, precision: str, sharded: bool = False) -> bool:
    """Whether a fused Adam/AdamW must be turned off on ``kind`` at ``precision``: 16-mixed on MPS,
    whose fused kernel ignored the GradScaler's ``found_inf`` until pytorch PR #186360, and
    16-mixed under FSDP (``sharded``), where Lightning skips the unscale for a fused optimizer and
    so ``ShardedGradScaler`` never agrees ``found_inf`` across the ranks (docs/hardware.md §3).
    One rule for the launch and the device smoke."""
    if precision != "16-mixed":
        return False
    return kind == "mps" or sharded


def validate_precision(precision: object, kind: str, bf16_supported: bool) -> str:
    """Refuse a precision the device cannot run, before Lightning fails deep in setup
    (docs/hardware.md §4): ``16-mixed`` on CPU, which Lightning 2.6.6 silently rewrites to
    ``bf16-mixed`` (``_check_and_init_precision``); ``64-true`` on MPS; bf16 where the device lacks
    it."""
    text = normalize_precision(precision)
    if text == "16-mixed" and kind == "cpu":
        better = "bf16-mixed" if bf16_supported else "32-true"
        raise ProfileError(
            "hardware.precision=16-mixed has no fp16 autocast on CPU (Lightning would silently run "
            f"bf16-mixed instead): set hardware.precision={better}"
        )
    if text == "64-true" and kind == "mps":
        raise ProfileError(
            "hardware.precision=64-true cannot run on MPS (no float64): set hardware.precision=32-true"
        )
    if text.startswith("bf16") and not bf16_supported:
        fallback = "16-mixed (or 32-true)" if kind == "cuda" else "32-true"
        raise ProfileError(
            f"hardware.precision={text} needs native bfloat16, which this {kind} device lacks: "
            f"set hardware.precision={fallback}"
        )
    return text


def precision_warning(precision: str, kind: str) -> str | None:
    """One line for a precision that runs but that laptrain has not measured on this device."""
    if precision == "16-mixed" and kind == "mps":
        return (
            "warning: hardware.precision=16-mixed on MPS is opt-in: fp16 autocast + "
            'GradScaler("mps") runs, but its speed and accuracy were never measured by laptrain; '
            "32-true is the tested default (docs/hardware.md)"
        )
    return None
