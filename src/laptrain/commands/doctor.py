"""``laptrain doctor``: is this machine ready to train, and if not, what to change (field note 004 asked for a self-test).

Each check returns a ``Check``; "ready" means every check passed, including a few real training
steps of a tiny model on the profile's device with its precision. Warnings (``ok`` with a note)
inform without blocking. Inputs (environment, machine, profile) are arguments, so tests can make a
check fail on purpose.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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
from laptrain.versions import package_versions

GiB = 1024**3
# the packages a run cannot do without (laptrain.versions lists more)
REQUIRED = ("torch", "lightning", "transformers", "peft", "hydra", "omegaconf")
SMOKE_LINE = (
    "device smoke test: python benchmarks/device_smoke.py (paste its table into a bug report)"
)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    warning: bool = False
    memory: bool = False  # failed because the job does not fit memory (an OOM, the preflight)

    def line(self) -> str:
        mark = "ok  " if self.ok and not self.warning else ("warn" if self.ok else "FAIL")
        return f"[{mark}] {self.name}: {self.detail}" + (f" -> {self.fix}" if self.fix else "")


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
            from laptrain.job.run import DOES_NOT_FIT_EXIT

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


@contextlib.contextmanager
def lightning_quiet() -> Iterator[None]:
    """Lightning's "GPU available" / tips lines would bury the report; the level is restored
    afterwards (the doctor may run inside another program, or a test session)."""
    from laptrain.console import logger_level

    with logger_level("lightning.pytorch", logging.WARNING):
        yield


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


def _trainer(kind: str, precision: str, **kw: Any) -> Any:
    """A Trainer for 3 steps on one device, with no logger, checkpoints, progress bar or summary."""
    import lightning.pytorch as pl

    return pl.Trainer(
        accelerator=kind,
        devices=1,
        precision=precision,
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )


def _tiny_bert() -> Any:
    """A 2-layer BERT classifier as a LightningModule that keeps its training losses."""
    import lightning.pytorch as pl
    import torch

    from laptrain.model.classifier.tiny_bert import tiny_bert_classifier

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_bert_classifier(
                num_labels=2, num_hidden_layers=2, max_position_embeddings=64
            )
            self.losses: list[float] = []

        def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
            loss = self.model(**batch).loss
            self.losses.append(float(loss.detach()))
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return Tiny()


def check_training(profile: Mapping[str, Any]) -> Check:
    """Three real optimizer steps of a tiny BERT classifier on the profile's device and precision."""
    import torch

    from laptrain.hardware.probe import TorchProbe
    from laptrain.preflight.batch import plan_batch

    kind = str(profile.get("accelerator", "cpu"))
    probe = TorchProbe(kind)
    try:
        precision = validate_precision(profile.get("precision"), kind, probe.bf16_supported())
    except ProfileError as err:
        return Check("training", False, str(err), "fix hardware.precision in the profile")
    torch.manual_seed(0)
    module = _tiny_bert()
    plan = plan_batch(module, 32, {**profile, "batch_size": 4, "precision": precision}, probe)
    data = [
        {
            "input_ids": torch.randint(0, 256, (32,)),
            "attention_mask": torch.ones(32, dtype=torch.long),
            "labels": torch.tensor(i % 2),
        }
        for i in range(12)
    ]
    with lightning_quiet():  # the Trainer's own "GPU available" lines too
        trainer = _trainer(kind, precision)
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=plan.micro_batch))
    if len(module.losses) < 3 or not all(math.isfinite(x) for x in module.losses):
        return Check("training", False, f"losses {module.losses}", "report this with --json output")
    return Check(
        "training",
        True,
        f"3 steps on {kind} in {precision}, loss {module.losses[0]:.3f} -> {module.losses[-1]:.3f}; "
        f"preflight estimate {plan.estimate.total / GiB:.2f} GiB",
    )


def _tiny_lora() -> Any:
    """A 2-layer Llama of 64 wide with LoRA on every linear layer and gradient checkpointing."""
    from functools import partial

    import torch

    from laptrain.model.lora.causal_lm import CausalLMLoRAModule

    backbone = {
        "model_type": "llama",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
    }
    return CausalLMLoRAModule(
        backbone=backbone,
        lora={"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"},
        gradient_checkpointing=True,
        optimizer=partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.0),
        scheduler="constant",
        save_adapters=False,
    )


def _losses(losses: list[float]) -> Any:
    """A callback that appends each training step's loss to ``losses``."""
    import lightning.pytorch as pl

    class Losses(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            losses.append(float(outputs["loss"]))

    return Losses()


def check_lora_training(profile: Mapping[str, Any]) -> Check:
    """Three LoRA steps of a tiny Llama with gradient checkpointing on the profile's device.

    Checkpointing with a frozen base is where LoRA breaks silently (no gradient reaches the
    adapters: transformers#26377, #42489), so besides finite losses every lora_B matrix (zeros at
    init) must have moved.
    """
    import torch

    from laptrain.hardware.probe import TorchProbe
    from laptrain.model.families import FAMILIES
    from laptrain.model.lora.tiny_llama import masked_token_batches

    kind = str(profile.get("accelerator", "cpu"))
    try:
        precision = validate_precision(
            profile.get("precision"), kind, TorchProbe(kind).bf16_supported()
        )
    except ProfileError as err:
        return Check("lora training", False, str(err), "fix hardware.precision in the profile")
    if FAMILIES["lora"].refusal(kind, precision):
        precision = "32-true"  # train.py refuses it for LoRA with its own line; test the rest
    torch.manual_seed(0)
    module = _tiny_lora()
    losses: list[float] = []
    loader = torch.utils.data.DataLoader(masked_token_batches(3), batch_size=None)
    with lightning_quiet():  # the Trainer's own "GPU available" lines too
        trainer = _trainer(
            kind,
            precision,
            limit_val_batches=0,
            num_sanity_val_steps=0,
            callbacks=[_losses(losses)],
        )
        trainer.fit(module, train_dataloaders=loader)
    lora_b = [p for n, p in module.named_parameters() if "lora_B" in n]
    moved = sum(bool(p.detach().abs().sum() > 0) for p in lora_b)
    if len(losses) < 3 or not all(math.isfinite(x) for x in losses) or moved < len(lora_b):
        return Check(
            "lora training",
            False,
            f"losses {losses}, {moved}/{len(lora_b)} LoRA B matrices updated with checkpointing",
            "report this with --json output",
        )
    return Check(
        "lora training",
        True,
        f"3 LoRA steps of a tiny Llama with gradient checkpointing on {kind} in {precision}, "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, {moved}/{len(lora_b)} LoRA B matrices updated",
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
    lora: bool = False,
    battery: BatterySource | None = None,
    pressure: PressureSource | None = None,
) -> Report:
    """Run every check; nothing here raises. ``lora``: a causal-LM LoRA model was named, so also
    run :func:`check_lora_training`. ``battery``, ``pressure``: injectable readers (None = the OS)."""
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
    if all(c.ok for c in checks):
        checks.append(_guard("training", lambda: check_training(profile)))
        if lora:
            checks.append(_guard("lora training", lambda: check_lora_training(profile)))
    else:
        checks.append(Check("training", False, "skipped: fix the failures above first"))
        if lora:
            checks.append(Check("lora training", False, "skipped: fix the failures above first"))
    return Report(checks)
