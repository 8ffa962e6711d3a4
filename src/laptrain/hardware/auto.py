"""Resolve ``hardware=auto`` (or no ``hardware=``) on the command line to ``hardware=<profile>``
before Hydra composes, so its ``env:`` applies before torch is imported, ``hardware.*`` overrides
still apply and ``--cfg job`` shows the real values. No torch import here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from laptrain.config.overrides import insert_overrides, override_indices
from laptrain.hardware.detect import MachineInfo, detect_machine
from laptrain.hardware.profile import ProfileError, load_profile, profile_names

# (generation, tier) of an Apple chip -> the profile made for it (Apple's spec sheets).
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
# field note 002's MacBook table: 8, 16, 32 GB. A Mac at or below a size gets that size's profile.
CPU_MAC_PROFILES = ((8, "macbook_cpu_8gb"), (16, "macbook_cpu_16gb"), (32, "macbook_cpu_32gb"))
# torch's MPS backend only accepts a device whose MPSGraph has a macOS 14 API (pytorch/pytorch:
# aten/src/ATen/mps/MPSDevice.mm); below it torch.backends.mps.is_available() is False.
MPS_MIN_MACOS = 14
CUDA_TORCH_FIX = (
    "install a CUDA build of torch: pip install --force-reinstall torch (PyPI's Linux x86_64 wheel "
    "is built with CUDA) or pip install torch --index-url https://download.pytorch.org/whl/cu<ver> "
    "(pick <ver> at pytorch.org/get-started/locally)"
)
INTEL_MAC = (
    "Intel Macs are not supported: PyTorch publishes no macOS x86_64 wheels after 2.2.2 and "
    "laptrain needs torch>=2.13"
)


class UnsupportedMachine(ProfileError):
    """No profile can train on this machine; the message says why and what would work."""


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


def cpu_profile_for(machine: MachineInfo) -> str:
    """The CPU-only profile for a machine: a MacBook's by RAM (field note 002), else ``cpu``."""
    if machine.system != "Darwin":
        return "cpu"
    for size, name in CPU_MAC_PROFILES:
        if machine.memory_gb <= size:
            return name
    return CPU_MAC_PROFILES[-1][1]


def mps_blocker(machine: MachineInfo) -> str:
    """Why torch's MPS cannot run on this Mac's OS ("" when it can, or the version is unknown)."""
    major = machine.macos_major
    if major is not None and major < MPS_MIN_MACOS:
        return (
            f"macOS {machine.macos_version} < {MPS_MIN_MACOS}: torch's MPS needs macOS "
            f"{MPS_MIN_MACOS}; training on CPU"
        )
    return ""


def cuda_blocker(machine: MachineInfo) -> str:
    """Why the installed torch cannot use the NVIDIA GPUs seen ("" when it can, or unknown)."""
    if machine.gpus and machine.torch_cuda is False:
        return f"torch {machine.torch_version} is built without CUDA; training on CPU ({CUDA_TORCH_FIX})"
    return ""


def choose_profile(machine: MachineInfo) -> Choice:
    """The closest profile for a machine (pure: tests pass recorded machines);
    ``UnsupportedMachine`` on an x86_64 macOS process (an Intel Mac, or Rosetta)."""
    if machine.intel_mac:
        if machine.rosetta:
            raise UnsupportedMachine(
                "this Python is x86_64 under Rosetta on an Apple Silicon Mac, and PyTorch publishes "
                "no macOS x86_64 wheels after 2.2.2 (laptrain needs torch>=2.13): install an arm64 "
                "Python (`python -c 'import platform; print(platform.machine())'` must say arm64)"
            )
        raise UnsupportedMachine(INTEL_MAC)
    if machine.gpus:
        names = sorted({g.name for g in machine.gpus})
        blocker = cuda_blocker(machine)
        if blocker:
            return Choice(cpu_profile_for(machine), machine, "no CUDA in torch", why=blocker)
        return Choice("cuda", machine, f"CUDA ({', '.join(names)} x{len(machine.gpus)})")
    chip = machine.apple_chip
    if chip is not None:
        blocker = mps_blocker(machine)
        if blocker:
            return Choice(cpu_profile_for(machine), machine, "no MPS", why=blocker)
        name = APPLE_PROFILES.get(chip)
        if name:
            return Choice(name, machine, "MPS")
        return Choice(
            "mps", machine, "MPS", why=f"no profile for M{chip[0]} {chip[1]}, generic MPS"
        )
    return Choice(cpu_profile_for(machine), machine, "no GPU")


def _batch_text(batch: object) -> str:
    return (
        "batch from preflight" if str(batch) == "auto" else f"batch {batch}, checked by preflight"
    )


def describe(
    choice: Choice, profile: dict, threads_override: int | None, details: bool = True
) -> str:
    """E.g. "Apple M2, 16 GB, 4P+4E cores, MPS → m2_air (threads 4, batch from preflight)";
    without ``details`` only the machine, the device and the profile (and why, if it is a
    fallback): train.py's run summary prints threads and batch itself, with their reasons."""
    chosen = f"{choice.machine.summary()}, {choice.device} → {choice.profile}"
    if not details:
        return chosen + (f" ({choice.why})" if choice.why else "")
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
    return f"{chosen} ({threads_text}, {_batch_text(profile.get('batch_size'))}{why})"


def _user_sets(args: list[str], key: str) -> bool:
    return any(args[i].split("=", 1)[0].lstrip("+~") == key for i in override_indices(args))


def _explicit_note(explicit: str, detect: Callable[[], MachineInfo]) -> str | None:
    """The note for an explicit ``hardware=<name>`` when this machine would get another profile."""
    if explicit not in profile_names():
        return None  # no such profile: the config check names the choices
    try:
        choice = choose_profile(detect())
    except UnsupportedMachine:
        return None  # the user chose a profile; torch itself will say what it lacks
    if explicit == choice.profile:
        return None
    why = f" ({choice.why})" if choice.why else ""
    return (
        f"note: hardware={explicit} was chosen, but this machine ({choice.machine.summary()}, "
        f"{choice.device}) would get hardware={choice.profile}{why}"
    )


def resolve_hardware_argv(
    argv: list[str],
    detect: Callable[[], MachineInfo] = detect_machine,
    profile_loader: Callable[[str], dict] = load_profile,
) -> tuple[list[str], str | None]:
    """Return argv with ``hardware=auto`` replaced by the detected profile, and a line saying why
    (None, or a note for an explicit profile this machine would not get); ``UnsupportedMachine``
    on a machine no profile fits."""
    args = list(argv)
    positions = [
        i for i in override_indices(args) if args[i].split("=", 1)[0] in ("hardware", "+hardware")
    ]
    explicit = args[positions[-1]].split("=", 1)[1] if positions else "auto"
    if explicit != "auto":
        return args, _explicit_note(explicit, detect)
    choice = choose_profile(detect())
    try:
        profile = profile_loader(choice.profile)
    except ProfileError:
        profile = {}
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
        args = insert_overrides(args, injected)
    return args, f"hardware=auto: {describe(choice, profile, threads, details=False)}"
