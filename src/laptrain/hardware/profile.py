"""Hardware profiles as data: where they live, how one is read without Hydra, what they may ask for.

The launcher reads a profile before Hydra composes (to print what ``hardware=auto`` chose), and
``laptrain doctor`` reads one without a training config, so this module loads ``conf/hardware/*.yaml``
itself, following their ``defaults`` within the group. It must not import torch (docs/hardware.md
§2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from laptrain.project import conf_dir

PRECISION_ALIASES = {"16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true"}
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true")


class ProfileError(ValueError):
    """A profile asks for something this device cannot do; the message names the option to change."""


def profile_names(root: Path | None = None) -> list[str]:
    """Every profile in ``conf/hardware`` (``auto`` included)."""
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
    """Refuse a precision the device cannot run, before Lightning fails deep in setup.

    - ``16-mixed`` on CPU: Lightning 2.6.6 silently rewrites it to ``bf16-mixed``
      (``accelerator_connector.py`` ``_check_and_init_precision``), so the run would not be what was
      asked: refused, naming bf16-mixed. On MPS it is allowed (fp16 autocast with
      ``torch.amp.GradScaler("mps")``); :func:`precision_warning` says it is unmeasured there.
    - ``64-true`` never on MPS (no float64 there).
    - bf16 precisions only where the device has bf16 (CUDA: native, not emulated).

    See docs/hardware.md §4 "Precision per device".
    """
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
