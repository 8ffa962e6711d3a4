"""TRM size presets and ``size=auto``: pick by memory (field note 002's rule) and a time budget.

The presets themselves are data in ``conf/model/trm_sudoku.yaml`` (each number cited there); this
module validates them and holds the choosing rule as a pure function, testable without a machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from laptrain.config.overrides import override_indices, overrides


@dataclass(frozen=True)
class SizePreset:
    """One named size: architecture, recursion, optimisation and what it costs on the reference.

    ``ram_class_gb`` is field note 002's RAM class (8, 16, or .inf = "more"); presets with None are
    only picked by ``auto`` as a faster fallback. ``ref_samples_per_s`` and ``ref_step_memory_gb``
    are measured on the 2-core x86 reference machine (benchmarks/trm_throughput.py).
    """

    hidden_size: int
    num_heads: int
    layers: int
    expansion: float
    swiglu_multiple: int
    mixer: str
    positions: str
    prefix_len: int
    cycles: int
    latent_steps: int
    n_sup: int
    lr: float
    weight_decay: float
    warmup_steps: int
    ema_decay: float
    micro_batch_size: int | None = None
    ram_class_gb: float | None = None
    in_auto: bool = True
    ref_samples_per_s: float | None = None
    ref_step_memory_gb: float | None = None


def parse_presets(sizes: Mapping[str, Mapping[str, Any]]) -> dict[str, SizePreset]:
    """Validate ``model.sizes``: every preset must have exactly the :class:`SizePreset` keys."""
    known = {f.name for f in fields(SizePreset)}
    presets = {}
    for name, values in sizes.items():
        unknown = set(values) - known
        if unknown:
            raise ValueError(
                f"model.sizes.{name} has unknown keys {sorted(unknown)}; allowed: {sorted(known)}"
            )
        try:
            presets[name] = SizePreset(**dict(values))
        except TypeError as err:
            raise ValueError(f"model.sizes.{name}: {err}") from None
    return presets


@dataclass(frozen=True)
class SizeChoice:
    """The outcome of ``size=auto``: the name and the lines that explain it."""

    name: str
    lines: tuple[str, ...]


def estimate_minutes(preset: SizePreset, target_samples: int, speed_scale: float) -> float | None:
    """Minutes to train ``target_samples`` supervision samples, from the reference speed."""
    if not preset.ref_samples_per_s:
        return None
    return target_samples / (preset.ref_samples_per_s * speed_scale) / 60.0


def _ram_class_pick(auto: Mapping[str, SizePreset], memory_gb: float) -> str:
    """The smallest preset whose RAM class holds ``memory_gb``, else the largest class's.

    Labelled GB: the RAM classes are field note 002's Mac sizes (marketing GB, which are GiB: a
    16 GB Mac has 16 x 2^30 bytes), and memory_gb is the number given (model.memory_gb, or
    hardware.memory_budget_gb, read in GiB) or psutil's total RAM / 2^30 (/ 1e9 read a 16 GB Mac
    as 17.2 and picked the 32 GB class)."""
    classed = sorted((p.ram_class_gb, n) for n, p in auto.items() if p.ram_class_gb is not None)
    if not classed:
        raise ValueError("model.size=auto needs presets with ram_class_gb in model.sizes")
    return next((n for gb, n in classed if memory_gb <= gb), classed[-1][1])


def choose_size(
    presets: Mapping[str, SizePreset],
    memory_gb: float,
    time_budget_min: float,
    target_samples: int,
    speed_scale: float = 1.0,
) -> SizeChoice:
    """Field note 002's RAM pick, stepped down to a faster preset when it would overrun the budget.

    1. RAM class: the smallest preset whose ``ram_class_gb`` is >= ``memory_gb``, else the one
       (``.inf`` = "more"); the largest class when memory exceeds them all.
    2. Candidates: presets in ``auto`` at most as slow as that pick whose measured step memory
       fits in half the RAM. The slowest candidate whose estimate fits ``time_budget_min`` wins
       (bigger within the budget); if none fits, the fastest, with a warning line.

    ``speed_scale`` multiplies the reference speeds (e.g. threads / 2 for a CPU with more cores).
    """
    if memory_gb <= 0 or time_budget_min <= 0 or target_samples <= 0 or speed_scale <= 0:
        raise ValueError(
            "model.size=auto needs memory_gb, time_budget_min, auto_target_samples > 0; "
            "set hardware.memory_budget_gb or model.memory_gb"
        )
    auto = {n: p for n, p in presets.items() if p.in_auto and p.ref_samples_per_s}
    ram_pick = _ram_class_pick(auto, memory_gb)
    pick_speed = presets[ram_pick].ref_samples_per_s
    lines = [f"size=auto: {memory_gb:.1f} GB RAM -> field note 002's RAM class picks {ram_pick!r}"]
    candidates = []
    for name, preset in sorted(auto.items(), key=lambda kv: kv[1].ref_samples_per_s):
        minutes = estimate_minutes(preset, target_samples, speed_scale)
        mem = preset.ref_step_memory_gb or 0.0
        fits_mem = mem <= memory_gb / 2
        lines.append(
            f"  {name:>10}: ~{minutes:,.0f} min for {target_samples:,} supervision samples, "
            f"~{mem:.2f} GB per step" + ("" if fits_mem else " (too big for this RAM)")
        )
        if preset.ref_samples_per_s >= pick_speed and fits_mem:
            candidates.append((name, minutes))
    within = [(n, m) for n, m in candidates if m <= time_budget_min]
    if within:
        name = within[0][0]
        reason = f"the biggest that fits the {time_budget_min:g}-minute budget"
    else:
        name = candidates[-1][0] if candidates else ram_pick
        reason = f"none fits the {time_budget_min:g}-minute budget; taking the fastest"
    lines.append(f"size=auto chose {name!r}: {reason}")
    return SizeChoice(name=name, lines=tuple(lines))


def _argv_value(argv: list[str], *keys: str) -> str | None:
    values = [a.split("=", 1)[1] for a in overrides(argv) if a.split("=", 1)[0].lstrip("+") in keys]
    return values[-1] if values and values[-1] not in ("null", "None", "") else None


def resolve_size_argv(argv: list[str], config_path: str) -> tuple[list[str], list[str]]:
    """Rewrite ``model.size=auto`` on the command line into the chosen preset, before Hydra
    composes (as ``hardware=auto`` is), so ``--cfg job`` shows the choice; return the lines that
    explain it. Memory: ``model.memory_gb`` or ``hardware.memory_budget_gb`` from the command line,
    else this machine's total RAM. No torch import. Only Hydra overrides count (not an option's
    value), and the choice replaces the override in place, so options keep their positions
    (``laptrain.config.overrides``).
    """
    import psutil
    import yaml

    where = [i for i in override_indices(argv) if argv[i].lstrip("+") == "model.size=auto"]
    if not where:
        return list(argv), []
    with open(config_path) as f:
        config = yaml.safe_load(f)
    memory = _argv_value(argv, "model.memory_gb", "hardware.memory_budget_gb")
    budget = _argv_value(argv, "model.time_budget_min") or config["time_budget_min"]
    choice = choose_size(
        parse_presets(config["sizes"]),
        float(memory) if memory else psutil.virtual_memory().total / 2**30,
        float(budget),
        int(config["auto_target_samples"]),
    )
    args = list(argv)
    for i in where:
        args[i] = args[i].replace("model.size=auto", f"model.size={choice.name}")
    return args, list(choice.lines)


def main(argv: list[str] | None = None) -> None:
    """Dry run of ``model.size=auto`` without torch: print the estimates and the choice."""
    import argparse

    import psutil
    import yaml

    parser = argparse.ArgumentParser(description="What model.size=auto would pick (no training).")
    parser.add_argument("--config", default="conf/model/trm_sudoku.yaml", help="the model YAML")
    parser.add_argument("--memory-gb", type=float, default=None, help="default: this machine")
    parser.add_argument("--budget-min", type=float, default=None, help="default: the YAML's")
    parser.add_argument("--speed-scale", type=float, default=1.0, help="speed vs the reference")
    args = parser.parse_args(argv)
    with open(args.config) as f:
        config = yaml.safe_load(f)
    memory = args.memory_gb or psutil.virtual_memory().total / 2**30
    budget = args.budget_min or float(config["time_budget_min"])
    choice = choose_size(
        parse_presets(config["sizes"]),
        memory,
        budget,
        int(config["auto_target_samples"]),
        args.speed_scale,
    )
    print("\n".join(choice.lines))


if __name__ == "__main__":
    main()
