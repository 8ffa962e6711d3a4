"""``laptrain doctor``: is this machine ready to train, and if not, what to change (field note 004).
"Ready" means every check passed, a few real training steps on the profile's device included;
warnings inform without blocking. Inputs are arguments, so tests can make a check fail."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from laptrain.family import Family
from laptrain.hardware.auto import (
    CUDA_TORCH_FIX,
    MPS_MIN_MACOS,
    choose_profile,
    cpu_profile_for,
    cuda_blocker,
    describe,
    mps_blocker,
)
from laptrain.hardware.detect import MachineInfo, detect_machine
from laptrain.hardware.env import resolve_watermarks
from laptrain.hardware.power import (
    PRESSURE_COLOURS,
    PRESSURE_WARNING,
    BatterySource,
    PressureSource,
    ProcessMemory,
    PsutilBattery,
    SysctlPressure,
    pressure_name,
    top_processes,
)
from laptrain.hardware.profile import ProfileError, load_profile, validate_precision
from laptrain.model.doctor_check import Check, lightning_quiet, quiet_trainer
from laptrain.versions import package_versions

GiB = 1024**3
# the packages a run cannot do without (laptrain.versions lists more)
REQUIRED = ("torch", "lightning", "transformers", "peft", "hydra", "omegaconf")
SMOKE_LINE = (
    "device smoke test: python benchmarks/device_smoke.py (paste its table into a bug report)"
)


@dataclass
class Report:
    checks: list[Check]

    @property
    def ready(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def exit_code(self) -> int:
        """0 ready; ``DOES_NOT_FIT_EXIT`` when every failed check is one that did not fit memory
        (as train.py's preflight refusal); 1 otherwise."""
        failed = [c for c in self.checks if not c.ok]
        if not failed:
            return 0
        if all(c.memory for c in failed):
            from laptrain.exit_codes import DOES_NOT_FIT_EXIT

            return DOES_NOT_FIT_EXIT
        return 1

    def text(self) -> str:
        lines = [c.line() for c in self.checks]
        failed = [c.name for c in self.checks if not c.ok]
        lines.append(SMOKE_LINE)
        lines.append(
            "ready" if self.ready else f"not ready: {', '.join(failed)} failed (see above)"
        )
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(
            {
                "ready": self.ready,
                "exit_code": self.exit_code,
                "checks": [asdict(c) for c in self.checks],
                "device_smoke": "python benchmarks/device_smoke.py",
            },
            indent=1,
        )


def check_machine(machine: MachineInfo, profile_name: str, profile: Mapping[str, Any]) -> Check:
    auto = choose_profile(machine)
    detail = describe(auto, load_profile(auto.profile), auto.threads())
    if profile_name != auto.profile:
        detail += f"; checking hardware={profile_name} as asked"
    return Check("machine", True, detail)


def check_versions(versions: Mapping[str, str] | None = None) -> Check:
    """Python and the package versions (``laptrain.versions``); a required one missing fails."""
    versions = package_versions() if versions is None else versions
    missing = [name for name in REQUIRED if name not in versions]
    if missing:
        return Check("versions", False, f"missing {', '.join(missing)}", "pip install -e .")
    return Check("versions", True, ", ".join(f"{k} {v}" for k, v in versions.items()))


def check_device(machine: MachineInfo, profile: Mapping[str, Any]) -> Check:
    import torch

    mps_built, mps_ok = torch.backends.mps.is_built(), torch.backends.mps.is_available()
    cuda_ok = torch.cuda.is_available()
    detail = f"MPS built {mps_built}, available {mps_ok}; CUDA available {cuda_ok}"
    if cuda_ok:
        detail += f" ({torch.cuda.get_device_name(0)} x{torch.cuda.device_count()})"
    if machine.apple_silicon and not mps_built:
        return Check(
            "device",
            False,
            detail + "; this torch build has no MPS on an Apple Silicon Mac",
            "pip install --force-reinstall torch (the macOS arm64 wheel from PyPI), "
            "or run with hardware=cpu",
        )
    wanted = profile.get("accelerator", "cpu")
    available = {"cpu": True, "mps": mps_ok, "cuda": cuda_ok}.get(wanted, False)
    if not available:
        return Check(
            "device",
            False,
            detail + f"; hardware={profile.get('name')} needs {wanted}",
            device_fix(machine, str(wanted)),
        )
    return Check("device", True, detail + f"; training on {wanted}")


def device_fix(machine: MachineInfo, wanted: str) -> str:
    """What to do when the profile's device is missing. Never points back at a profile that needs
    the same missing device (hardware=auto picks MPS on a Mac whose macOS is unknown)."""
    cpu = cpu_profile_for(machine)
    if wanted == "mps" and mps_blocker(machine):
        return f"update macOS to {MPS_MIN_MACOS} or later, or use hardware={cpu} (CPU)"
    if wanted == "cuda" and machine.gpus and (cuda_blocker(machine) or machine.torch_cuda is None):
        return f"{CUDA_TORCH_FIX}, or use hardware={cpu}"
    try:
        auto = choose_profile(machine).profile
        auto_device = load_profile(auto).get("accelerator", "cpu")
    except ProfileError:
        auto, auto_device = cpu, "cpu"
    if auto_device != wanted:
        return f"use hardware=auto (picks {auto} here) or hardware={cpu}"
    return f"use hardware={cpu} (CPU)"


def check_env(profile: Mapping[str, Any], environ: Mapping[str, str]) -> Check:
    wanted = {k: str(v) for k, v in (profile.get("env") or {}).items() if v is not None}
    applied = [f"{k}={v}" for k, v in wanted.items() if k not in environ]
    yours = [f"{k}={environ[k]}" for k in wanted if k in environ and environ[k] != wanted[k]]
    detail = f"profile sets {', '.join(applied) or 'nothing'}"
    if yours:
        detail += f"; you exported (wins over the profile): {', '.join(yours)}"
    return Check("env", True, detail, warning=bool(yours))


def check_watermarks(profile: Mapping[str, Any], environ: Mapping[str, str]) -> Check:
    """The launcher's own watermark check (``env.resolve_watermarks``): same verdict, same words."""
    marks = resolve_watermarks(profile.get("env"), environ)
    if not marks.ok:
        return Check("mps watermark", False, marks.problem, marks.fix)
    detail = f"HIGH {marks.high:g}, LOW {marks.low:g}"
    if marks.notes:
        return Check("mps watermark", True, f"{detail}; " + "; ".join(marks.notes), warning=True)
    return Check("mps watermark", True, detail)


def check_quantization(machine: MachineInfo) -> Check:
    if machine.system != "Darwin":
        return Check("qlora", True, "bitsandbytes is not checked off macOS")
    return Check(
        "qlora",
        True,
        "4-bit QLoRA (model.quantization=4bit) runs on CUDA only in laptrain: on a Mac use LoRA on a "
        "bf16 base (model.base_dtype=bfloat16)",
        warning=True,
    )


def check_disk(folder: Path, need_bytes: float, what: str) -> Check:
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    detail = f"{free / GiB:.1f} GiB free in {existing}; {what} need {need_bytes / GiB:.1f} GiB"
    if free < need_bytes:
        return Check("disk", False, detail, "free disk space or set paths.* to another drive")
    return Check("disk", True, detail)


def check_battery(source: BatterySource | None = None) -> Check:
    """Today's battery (psutil): on battery is a warning, since long runs belong on the charger."""
    reading = (source or PsutilBattery()).read()
    if reading is None:
        return Check("battery", True, "none found (a desktop, or the OS does not say)")
    plug = {True: "on the charger", False: "on battery", None: "charger state unknown"}
    detail = f"{reading.percent:.0f} %, {plug[reading.plugged]}"
    if reading.on_battery:
        return Check(
            "battery",
            True,
            detail,
            "plug in for long runs: on battery below callbacks.power_guard.min_percent (20 %) "
            "the run checkpoints and stops",
            warning=True,
        )
    return Check("battery", True, detail)


def check_memory_pressure(
    machine: MachineInfo,
    source: PressureSource | None = None,
    top: Callable[[], list[ProcessMemory]] = top_processes,
) -> Check:
    """macOS memory pressure today (docs/hardware.md §16) and the processes holding the most memory."""
    consumers = "; ".join(p.text() for p in top()) or "none readable"
    if machine.system != "Darwin":
        detail = f"the level is read on macOS only; most memory: {consumers}"
        return Check("memory pressure", True, detail)
    level = (source or SysctlPressure()).read()
    if level is None:
        detail = f"sysctl kern.memorystatus_vm_pressure_level unreadable; most memory: {consumers}"
        return Check("memory pressure", True, detail, warning=True)
    detail = (
        f"{pressure_name(level)} ({PRESSURE_COLOURS.get(level, '?')}); most memory: {consumers}"
    )
    if level >= PRESSURE_WARNING:
        fix = "close what you can spare of the above before training"
        return Check("memory pressure", True, detail, fix, warning=True)
    return Check("memory pressure", True, detail)


def checkpoint_need(params: int | None, kept: int = 3) -> tuple[float, str]:
    """Bytes for the kept checkpoints: 4 B fp32 weights + 8 B AdamW state (exp_avg, exp_avg_sq: torch/optim/adamw.py) per parameter per file, 1 GiB spare."""
    if params is None:
        return 2.0 * GiB, "checkpoints (model size unknown)"
    return params * 12.0 * kept + GiB, f"{kept} checkpoints of a {params / 1e6:.1f} M model + 1 GiB"


def _tiny_encoder() -> Any:
    """A 2-layer transformer encoder classifier of torch's own layers, keeping its losses."""
    import lightning.pytorch as pl
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(256, 64)
            layer = nn.TransformerEncoderLayer(64, 2, 128, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(64, 2)
            self.losses: list[float] = []

        def loss(self, batch: dict) -> torch.Tensor:
            padding = batch["attention_mask"] == 0
            hidden = self.encoder(self.embed(batch["input_ids"]), src_key_padding_mask=padding)
            return F.cross_entropy(self.head(hidden[:, 0]), batch["labels"])

        def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
            loss = self.loss(batch)
            self.losses.append(float(loss.detach()))
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return Tiny()


def check_training(profile: Mapping[str, Any]) -> Check:
    """Three real optimizer steps of a tiny classifier on the profile's device and precision."""
    import torch

    from laptrain.hardware.probe import TorchProbe
    from laptrain.preflight.batch import plan_batch
    from laptrain.preflight.request import PlanRequest

    kind = str(profile.get("accelerator", "cpu"))
    probe = TorchProbe(kind)
    try:
        precision = validate_precision(profile.get("precision"), kind, probe.bf16_supported())
    except ProfileError as err:
        return Check("training", False, str(err), "fix hardware.precision in the profile")
    torch.manual_seed(0)
    module = _tiny_encoder()

    def rows(count: int, length: int) -> list[dict[str, torch.Tensor]]:
        return [
            {
                "input_ids": torch.randint(0, 256, (length,)),
                "attention_mask": torch.ones(length, dtype=torch.long),
                "labels": torch.tensor(i % 2),
            }
            for i in range(count)
        ]

    budget = {k: profile[k] for k in ("memory_fraction", "memory_budget_gb") if k in profile}
    plan = plan_batch(
        module,
        32,
        PlanRequest(auto=False, size=4, **budget),
        probe,
        precision,
        make_batch=lambda size, length: torch.utils.data.default_collate(rows(size, length)),
        loss_fn=lambda model, batch: model.loss(batch),
    )
    data = rows(12, 32)
    with lightning_quiet():  # the Trainer's own "GPU available" lines too
        trainer = quiet_trainer(kind, precision)
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=plan.micro_batch))
    if len(module.losses) < 3 or not all(math.isfinite(x) for x in module.losses):
        return Check("training", False, f"losses {module.losses}", "report this with --json output")
    return Check(
        "training",
        True,
        f"3 steps on {kind} in {precision}, loss {module.losses[0]:.3f} -> {module.losses[-1]:.3f}; "
        f"preflight estimate {plan.estimate.total / GiB:.2f} GiB",
    )


def check_pretrained_cache() -> Check:
    """Which pretrained weights are already in laptrain's cache (a run needs no index for them)."""
    from laptrain.pretrained.sources import list_cached, models_dir

    entries = list_cached()
    if not entries:
        return Check(
            "pretrained cache",
            True,
            f"empty ({models_dir()}); `laptrain fetch MODEL` fills it before going offline",
        )
    names = [f"{Path(e.label).name} ({e.size_bytes / 1024**2:,.0f} MB)" for e in entries]
    return Check("pretrained cache", True, f"{len(entries)} cached: {', '.join(names)}")


def _guard(name: str, check: Callable[[], Check]) -> Check:
    """A check that raises becomes a failed check naming the error, not a traceback."""
    try:
        return check()
    except Exception as err:  # noqa: BLE001 - the doctor reports every failure
        from laptrain.callbacks.oom_backoff import is_oom
        from laptrain.preflight.batch import PreflightError

        memory = isinstance(err, PreflightError) or is_oom(err)
        return Check(name, False, f"{type(err).__name__}: {err}".splitlines()[0], memory=memory)


def run_doctor(
    profile_name: str = "auto",
    environ: Mapping[str, str] | None = None,
    machine: MachineInfo | None = None,
    output_dir: Path | None = None,
    params: int | None = None,
    family: Family | None = None,
    battery: BatterySource | None = None,
    pressure: PressureSource | None = None,
) -> Report:
    """Run every check; nothing here raises. ``family``: that of ``model=<preset>``, whose
    ``doctor_check`` runs after the generic training check."""
    environ = dict(os.environ if environ is None else environ)
    machine = machine or detect_machine()
    try:
        name = choose_profile(machine).profile if profile_name == "auto" else profile_name
        profile = load_profile(name)
    except ProfileError as err:  # incl. a machine no profile fits (an Intel Mac)
        return Report([Check("profile", False, str(err))])
    need, what = checkpoint_need(params)
    checks = [
        _guard("machine", lambda: check_machine(machine, name, profile)),
        _guard("versions", check_versions),
        _guard("device", lambda: check_device(machine, profile)),
        _guard("env", lambda: check_env(profile, environ)),
        _guard("mps watermark", lambda: check_watermarks(profile, environ)),
        _guard("qlora", lambda: check_quantization(machine)),
        _guard("disk", lambda: check_disk(output_dir or Path("outputs"), need, what)),
        _guard("battery", lambda: check_battery(battery)),
        _guard("memory pressure", lambda: check_memory_pressure(machine, pressure)),
        _guard("pretrained cache", check_pretrained_cache),
    ]
    own = f"{family.name} training" if family is not None and family.doctor_check else None
    if all(c.ok for c in checks):
        checks.append(_guard("training", lambda: check_training(profile)))
        if own:
            checks.append(_guard(own, lambda: family.doctor_check(profile)))
    else:
        checks.append(Check("training", False, "skipped: fix the failures above first"))
        if own:
            checks.append(Check(own, False, "skipped: fix the failures above first"))
    return Report(checks)
