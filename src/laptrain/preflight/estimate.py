"""The memory estimate of one training step: overhead + weights + grads + optimizer state (trainable
only) + saved activations (activations.py) + backward's transient buffers (+ under FSDP the units
gathered at once, the rest 1/N), calibrated on benchmarks/preflight.py."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from laptrain.model.fsdp_units import gathered_units
from laptrain.preflight.activations import (
    ActivationProfile,
    LossFn,
    MakeBatch,
    measure_activations,
)
from laptrain.preflight.resident import file_mappings, resident_parameter_bytes

GiB = 1024**3


@dataclass(frozen=True)
class Calibration:
    """What a step needs beyond weights, grads, optimizer state and saved activations: the first
    step's one-time ``step_overhead``; ``per_activation`` extra bytes per saved-activation byte;
    ``per_largest`` per byte of one sample's largest saved tensor (e.g. a causal LM's logits); and
    ``retained``, with checkpointing, per byte of freed block activations that glibc's malloc keeps
    (SmolLM2-135M: ~0.16 GiB per block at 16 x 256; docs/hardware.md §9b)."""

    step_overhead: float
    per_activation: float
    per_largest: float
    retained: float = 0.0


# (device kind, gradient checkpointing) -> calibration. The CPU rows are least-squares fits of
# benchmarks/preflight.py (BERT and Llama grids, the checkpointing row with SmolLM2-135M's 30 blocks),
# per_activation then lowered by 0.07 on the real presets (docs/benchmarks.md, "Memory preflight").
# The device rows are NOT measured (no GPU or Mac was available): they assume only backward's
# gradient buffers; preflight.verify=true measures the real peak on the device.
CALIBRATION = {
    ("cpu", False): Calibration(step_overhead=57e6, per_activation=0.40, per_largest=1.0),
    ("cpu", True): Calibration(
        step_overhead=57e6, per_activation=0.47, per_largest=0.0, retained=0.61
    ),
    ("device", False): Calibration(step_overhead=0.0, per_activation=0.25, per_largest=2.0),
    ("device", True): Calibration(step_overhead=0.0, per_activation=1.0, per_largest=2.0),
}
# Device allocators round and cache blocks: fraction added to device estimates (CUDA/MPS), where the
# process baseline is outside the budget.
DEVICE_ALLOCATOR_SLACK = 0.10


@dataclass(frozen=True)
class Estimate:
    """Peak memory of one training step at ``micro_batch``, in bytes, by part."""

    micro_batch: int
    seq_len: int
    weights: float
    grads: float
    optimizer: float
    activations: float
    transient: float
    overhead: float
    gathered: float = 0.0  # FSDP: the units' full weights and grads gathered at the peak

    @property
    def total(self) -> float:
        return (
            self.weights
            + self.grads
            + self.optimizer
            + self.activations
            + self.transient
            + self.overhead
            + self.gathered
        )

    def line(self) -> str:
        parts = (
            ("weights", self.weights),
            ("grads", self.grads),
            ("optimizer", self.optimizer),
            ("activations", self.activations + self.transient),
            ("overhead", self.overhead),
        ) + ((("gathered by FSDP", self.gathered),) if self.gathered else ())
        detail = ", ".join(f"{name} {value / GiB:.2f}" for name, value in parts)
        tokens = f" x {self.seq_len} tokens" if self.seq_len else ""  # 0: measured, any module
        return f"{self.total / GiB:.2f} GiB at micro batch {self.micro_batch}{tokens} ({detail})"


@dataclass(frozen=True)
class ModelMemory:
    """What the estimate needs from the model; measured once, reused for every batch size."""

    params: int
    trainable: int
    param_bytes: int  # bytes per parameter in the precision it trains in
    # parameter bytes resident in this process (CPU) before the measuring passes: the mapped
    # pages of a safetensors file not read yet are not (preflight/resident.py)
    materialized_cpu_bytes: int
    activations: ActivationProfile
    activation_scale: float  # 0.5 for 16-true/bf16-true, 2 for 64-true (measured in fp32)
    # bytes FULL_SHARD holds unsharded at the peak (fsdp_units.gathered_units in the precision
    # FSDP computes in); None: not counted, the model is one root unit (all of it gathered)
    fsdp_gathered: float | None = None

    def estimate(
        self,
        micro_batch: int,
        seq_len: int,
        kind: str,
        baseline: float,
        optimizer_states: int = 2,
        checkpointing: bool | None = None,
        shards: int = 1,
    ) -> Estimate:
        """``shards`` > 1: FSDP FULL_SHARD, 1/shards of the state per rank plus the units gathered
        at the peak (``laptrain.model.fsdp_units.GatheredUnits``)."""
        acts = self.activations
        on = acts.checkpointing if checkpointing is None else checkpointing
        calibration = CALIBRATION["cpu" if kind == "cpu" else "device", bool(on and acts.blocks)]
        per_sample = acts.per_sample(seq_len, on)
        activations = (acts.fixed + micro_batch * per_sample) * self.activation_scale
        largest = micro_batch * acts.largest_tensor(seq_len) * self.activation_scale
        transient = calibration.per_activation * activations + calibration.per_largest * largest
        if on and acts.blocks:
            freed = micro_batch * acts.freed_in_forward(seq_len) * self.activation_scale
            transient += calibration.retained * freed
        weights = float(self.params * self.param_bytes) / shards
        grads = float(self.trainable * self.param_bytes) / shards
        optimizer = float(self.trainable * self.param_bytes * optimizer_states) / shards
        gathered = 0.0
        if shards > 1:
            whole = float((self.params + self.trainable) * self.param_bytes)
            gathered = whole if self.fsdp_gathered is None else self.fsdp_gathered
        overhead = calibration.step_overhead
        if kind == "cpu":
            overhead += baseline
        else:
            static = weights + grads + optimizer + gathered
            overhead += DEVICE_ALLOCATOR_SLACK * (static + activations + transient)
        return Estimate(
            micro_batch,
            seq_len,
            weights,
            grads,
            optimizer,
            activations,
            transient,
            overhead,
            gathered,
        )


def _param_bytes(model: nn.Module, precision: str) -> tuple[int, float]:
    if precision in ("16-true", "bf16-true"):
        return 2, 0.5
    if precision == "64-true":
        return 8, 2.0
    first = next(model.parameters(), None)
    return (first.element_size() if first is not None else 4), 1.0


def fsdp_compute_bytes(precision: str) -> int:
    """Bytes per parameter FSDP gathers in: Lightning's FSDP precision plugin sets FSDP's
    ``MixedPrecision.param_dtype`` to fp16/bf16 for the 16-bit precisions and to fp32 for
    ``32-true`` (``lightning/pytorch/plugins/precision/fsdp.py``, ``mixed_precision_config``)."""
    return 2 if precision.startswith(("16", "bf16")) else 4


def model_memory(
    model: nn.Module,
    seq_len: int,
    precision: str,
    make_batch: MakeBatch | None = None,
    loss_fn: LossFn | None = None,
) -> ModelMemory:
    """Count parameters, measure activations, and size the FSDP units the run would wrap."""
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    param_bytes, scale = _param_bytes(model, precision)
    # before the measuring passes, which read every weight (preflight/resident.py)
    resident = resident_parameter_bytes(model, file_mappings())
    measured_precision = precision if precision.endswith("-mixed") else "32-true"
    acts = measure_activations(model, seq_len, measured_precision, make_batch, loss_fn)
    units = gathered_units(model)
    gathered = float((units.params + units.grads) * fsdp_compute_bytes(precision))
    return ModelMemory(params, trainable, param_bytes, resident, acts, scale, gathered)
