"""Resolve ``hardware=auto`` to a concrete profile before Hydra composes the config.

The launcher rewrites ``hardware=auto`` (or no ``hardware=`` at all) on the command line into
``hardware=<profile>``, so that the chosen profile's ``env:`` is applied before torch is imported,
user overrides of ``hardware.*`` still apply, and ``--cfg job`` shows the real values.
Detection here must not import torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from laptrain.hardware.detect import MachineInfo, detect_machine
from laptrain.hardware.profile import ProfileError, load_profile

# (generation, tier) of an Apple chip -> the profile made for it (FACTS.md §10 and spec sheets).
APPLE_PROFILES = {
    (1, "base"): "m1_mini",
    (2, "base"): "m2_air",
    (3, "pro"): "m3_pro",
    (3, "max"): "m3_max",
    (4, "pro"): "m4_pro",
    (4, "max"): "m4_max",
    (5, "base"): "m5",
    (5, "pro"): "m5_pro",
    (5, "max"): "m5_max",
}
# seed 002's MacBook table: 8, 16, 32 GB. A Mac at or below a size gets that size's profile.
CPU_MAC_PROFILES = ((8, "macbook_cpu_8gb"), (16, "macbook_cpu_16gb"), (32, "macbook_cpu_32gb"))


@dataclass(frozen=True)
class Choice:
    """The profile for a machine, what the machine is, and why that profile."""

    profile: str
    machine: MachineInfo
    device: str  # "MPS", "CUDA (<name>)", "no GPU"
    why: str = ""  # only when the choice is a fallback

    def threads(self) -> int | None:
        """Threads a CPU profile should use when it leaves ``torch_threads`` null: the P cores."""
        return self.machine.performance_cores or self.machine.physical_cores or None


def choose_profile(machine: MachineInfo) -> Choice:
    """The closest profile for a machine (pure: tests pass recorded machines)."""
    if machine.gpus:
        names = sorted({g.name for g in machine.gpus})
        return Choice("cuda", machine, f"CUDA ({', '.join(names)} x{len(machine.gpus)})")
    chip = machine.apple_chip
    if chip is not None:
        name = APPLE_PROFILES.get(chip)
        if name:
            return Choice(name, machine, "MPS")
        return Choice(
            "mps", machine, "MPS", why=f"no profile for M{chip[0]} {chip[1]}, generic MPS"
        )
    if machine.system == "Darwin":
        for size, name in CPU_MAC_PROFILES:
            if machine.memory_gb <= size:
                return Choice(name, machine, "no GPU")
        return Choice(CPU_MAC_PROFILES[-1][1], machine, "no GPU")
    return Choice("cpu", machine, "no GPU")


def _batch_text(batch: object) -> str:
    return (
        "batch from preflight" if str(batch) == "auto" else f"batch {batch}, checked by preflight"
    )


def describe(choice: Choice, profile: dict, threads_override: int | None) -> str:
    """E.g. "Apple M2, 16 GB, 4P+4E cores, MPS → m2_air (threads 4, batch from preflight)"."""
    threads = profile.get("torch_threads") or threads_override
    if threads is None:
        threads_text = (
            "threads: torch default = P cores"
            if choice.device == "MPS"
            else "threads: torch default"
        )
    else:
        threads_text = f"threads {threads}"
    why = f"; {choice.why}" if choice.why else ""
    return (
        f"{choice.machine.summary()}, {choice.device} → {choice.profile} "
        f"({threads_text}, {_batch_text(profile.get('batch_size'))}{why})"
    )


def _user_sets(args: list[str], key: str) -> bool:
    return any(a.split("=", 1)[0].lstrip("+~") == key for a in args)


def resolve_hardware_argv(
    argv: list[str],
    detect: Callable[[], MachineInfo] = detect_machine,
    profile_loader: Callable[[str], dict] = load_profile,
) -> tuple[list[str], str | None]:
    """Return argv with ``hardware=auto`` replaced by the detected profile, and a line saying why.

    With an explicit ``hardware=<name>`` argv is kept; the line is then a note when this machine
    would have been given another profile (None when they agree). A CPU profile that leaves
    ``torch_threads`` null gets the detected physical-core count as ``hardware.torch_threads=N``,
    unless the user set that key.
    """
    args = list(argv)
    positions = [i for i, a in enumerate(args) if a.split("=", 1)[0] in ("hardware", "+hardware")]
    explicit = args[positions[-1]].split("=", 1)[1] if positions else "auto"
    choice = choose_profile(detect())
    if explicit != "auto":
        if explicit == choice.profile:
            return args, None
        return args, (
            f"note: hardware={explicit} was chosen, but this machine ({choice.machine.summary()}, "
            f"{choice.device}) would get hardware={choice.profile}"
        )
    try:
        profile = profile_loader(choice.profile)
    except ProfileError:
        profile = {}
    batch = [a.split("=", 1)[1] for a in args if a.split("=", 1)[0] == "hardware.batch_size"]
    if batch:
        profile = {**profile, "batch_size": batch[-1]}  # the line shows what will run
    threads = None
    if (
        profile.get("accelerator") == "cpu"
        and profile.get("torch_threads") is None
        and not _user_sets(args, "hardware.torch_threads")
    ):
        threads = choice.threads()
    injected = [f"hardware={choice.profile}"]
    if threads:
        injected.append(f"hardware.torch_threads={threads}")
    if positions:
        where = positions[-1]
        args[where : where + 1] = injected
    else:
        args.extend(injected)
    return args, f"hardware=auto: {describe(choice, profile, threads)}"
