"""The LoRA family's memory estimate from the base's ``config.json`` alone (no weights): its
``FAMILY.sizing`` hook, which ``laptrain preflight`` (``laptrain/preflight/from_config.py``)
calls for a causal-LM LoRA config (``CausalLMLoRAModule``, DPO's too).

Parameters are counted on the meta device, and the saved-for-backward bytes are measured on a
2-layer copy at full width (same hidden size, heads and vocabulary, so the logits B·S·V are real)
at short lengths on CPU, then extrapolated in length (``laptrain.preflight.activations``) and in
depth (the per-layer parts times layers / 2). The sum follows ``laptrain.preflight.estimate``: the
frozen base in its own dtype, the adapters in fp32 with their gradients and AdamW state.
``benchmarks/lora_throughput.py --preflight`` uses this module too.
Only ``laptrain preflight`` and that benchmark import it.
"""

from __future__ import annotations

import platform
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from laptrain.config.batch_request import is_auto
from laptrain.families.lora.grpo_sizing import (
    Rollout,
    kv_cache_bytes,
    policy_batch_maker,
    policy_loss,
    reference_bytes,
    rollout_of,
    sampling_bytes,
)
from laptrain.model.gradient_checkpointing import switch_on
from laptrain.preflight.activations import (
    ActivationProfile,
    LossFn,
    MakeBatch,
    Quadratic,
    measure_activations,
)
from laptrain.preflight.estimate import DEVICE_ALLOCATOR_SLACK, Estimate, ModelMemory
from laptrain.preflight.from_config import PreflightInputError

GiB = 1024**3
GB = 1e9
MEASURED_LAYERS = 2
MEASURED_SEQ = 32  # measured at 8, 16 and 24 tokens: the quadratic fit is exact in length
SMALL_TENSOR = 1 << 22
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
MAX_AUTO_MICRO = 4096
# GRPO on CPU, measured on SmolLM2 (32 sequences x 111 tokens): the policy forward and backward
# raise the peak RSS 1.35 x the saved-tensor profile's activations + transient (the freed per-layer
# temporaries, 22 MB each, stay resident under glibc); train.py's process holds 0.2 GiB more than
# this one before its first step (Lightning, the data, the logger: 0.6 against 0.4 GiB).
GRPO_CPU_STEP_RSS = 1.35
TRAINING_PROCESS_RSS = 0.2 * GiB
# meta-llama/Llama-3.2-3B-Instruct config.json fields that size it (3,212,749,824 parameters).
LLAMA32_3B = {
    "vocab_size": 128256,
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 28,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
    "rope_theta": 500000.0,
}


@dataclass(frozen=True)
class LoRACounts:
    params: int  # base + adapters
    trainable: int  # adapters only

    @property
    def base(self) -> int:
        return self.params - self.trainable


@dataclass(frozen=True)
class BudgetChoice:
    bytes: float
    source: str
    bf16: bool  # whether the target device computes in bfloat16


def _is_apple(profile: Mapping[str, Any]) -> bool:
    return profile.get("accelerator") == "mps" or str(profile.get("name", "")).startswith("macbook")


def choose_budget(hw: Mapping[str, Any]) -> BudgetChoice:
    """The profile's budget: measured on this machine when the profile is for it, else
    ``hardware.memory_budget_gb``; an Apple profile on another machine without it is refused."""
    from laptrain.hardware.probe import TorchProbe
    from laptrain.preflight.budget import device_budget

    kind = str(hw.get("accelerator", "cpu"))
    given = hw.get("memory_budget_gb")
    fraction = float(hw.get("memory_fraction", 0.8))
    probe = TorchProbe(kind)
    here = probe.available() and (not _is_apple(hw) or platform.system() == "Darwin")
    if here:
        budget = device_budget(probe, fraction, given)
        return BudgetChoice(budget.bytes, f"{budget.source} (this machine)", probe.bf16_supported())
    name = hw.get("name", kind)
    if given:
        return BudgetChoice(
            float(given) * GiB,
            f"hardware.memory_budget_gb={given} (hardware={name} is for another machine)",
            kind != "cpu",
        )
    where = "a Mac" if _is_apple(hw) else f"a {kind.upper()} machine"
    raise PreflightInputError(
        f"hardware={name} is for {where}, not this one: its memory budget cannot be probed here; "
        f"add hardware.memory_budget_gb=<GiB> (e.g. 0.65 x 0.75 x the Mac's RAM for an MPS profile)"
    )


def causal_lm_config(model_cfg: Mapping[str, Any]) -> Any | None:
    """The transformers config a LoRA model config names (hub name, folder or backbone dict);
    None for a base built from ``tiny_base``. Only ``config.json`` is read."""
    from transformers import AutoConfig

    from laptrain.families.lora.gguf_source import config_from_pretrained

    pretrained, backbone = model_cfg.get("pretrained"), model_cfg.get("backbone")
    if pretrained:
        return config_from_pretrained(
            pretrained,
            "set model.pretrained to a folder written by save_pretrained (config.json is enough)",
        )
    if backbone and "model_type" in backbone:
        fields = {k: v for k, v in backbone.items() if k != "model_type"}
        return AutoConfig.for_model(backbone["model_type"], **fields)
    return None


def _targets(lora: Mapping[str, Any]) -> str | list[str]:
    targets = lora.get("target_modules", "all-linear")
    if isinstance(targets, Sequence) and not isinstance(targets, str):
        return [str(t) for t in targets]
    return str(targets)


def lora_model(
    config: Any, lora: Mapping[str, Any], device: str, layers: int | None = None
) -> nn.Module:
    """The peft model of ``config`` (optionally cut to ``layers``) on ``device``.

    On ``cpu`` the weights are not initialised: the activation measurement needs the sizes of saved
    tensors, not their values. Norms and buffers (rotary frequencies) are zeroed; the large
    matrices are left as allocated (fresh pages, which read as zeros without being written:
    zeroing or a random init of a 128k x 3072 embedding costs seconds).
    """
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    if layers is not None:
        config = type(config).from_dict({**config.to_dict(), "num_hidden_layers": layers})
    config.use_cache = False
    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(config)
    base.tie_weights()  # transformers 5.0 leaves a tied head untied on the meta device
    if device != "meta":
        base = base.to_empty(device=device)
        with torch.no_grad():
            for tensor in (*base.parameters(), *base.buffers()):
                if tensor.numel() < SMALL_TENSOR:
                    tensor.zero_()
    r = int(lora.get("r", 8))
    peft_config = LoraConfig(
        r=r,
        lora_alpha=int(lora.get("alpha", 2 * r)),
        target_modules=_targets(lora),
        use_dora=bool(lora.get("use_dora", False)),
        use_rslora=bool(lora.get("use_rslora", False)),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():  # peft asks transformers' deprecated is_gradient_checkpointing
        warnings.simplefilter("ignore", FutureWarning)
        return get_peft_model(base, peft_config)


def count_lora(config: Any, lora: Mapping[str, Any]) -> LoRACounts:
    """Parameters with the adapters, and the adapters' own, counted on the meta device."""
    model = lora_model(config, lora, "meta")
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return LoRACounts(params, trainable)


def _scaled(q: Quadratic, factor: float) -> Quadratic:
    return Quadratic(q.c * factor, q.a * factor, q.b * factor)


def measure_lora_activations(
    config: Any,
    lora: Mapping[str, Any],
    seq_len: int = MEASURED_SEQ,
    make_batch: MakeBatch | None = None,
    loss_fn: LossFn | None = None,
) -> ActivationProfile:
    """Saved-for-backward bytes of the full-depth model, from a 2-layer full-width copy on CPU.

    Measured with gradient checkpointing on (the profile answers both ways); the per-layer parts
    (the blocks' inputs, and the blocks' share of the total) are scaled from 2 layers to all.
    ``make_batch``/``loss_fn``: another step than the causal-LM loss (GRPO's policy pass).
    """
    layers = int(config.num_hidden_layers)
    small = lora_model(config, lora, "cpu", layers=MEASURED_LAYERS)
    kwargs = {"use_reentrant": False}
    with warnings.catch_warnings():  # transformers' deprecation notes about the old names
        warnings.simplefilter("ignore", FutureWarning)
        base = small.get_base_model()
        switch_on(base, kwargs)
        base.enable_input_require_grads()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            profile = measure_activations(small, seq_len, make_batch=make_batch, loss_fn=loss_fn)
    del small
    factor = layers / MEASURED_LAYERS
    in_blocks = Quadratic(
        profile.total.c - profile.outside.c,
        profile.total.a - profile.outside.a,
        profile.total.b - profile.outside.b,
    )
    total = _scaled(in_blocks, factor)
    return replace(
        profile,
        total=Quadratic(
            profile.outside.c + total.c, profile.outside.a + total.a, profile.outside.b + total.b
        ),
        block_inputs=_scaled(profile.block_inputs, factor),
        blocks=layers,
        checkpointing=True,
    )


def logits_bytes(micro_batch: int, seq_len: int, vocab: int) -> float:
    """The fp32 logits of one micro batch, B·S·V·4: the largest tensor of a causal-LM step."""
    return float(micro_batch * seq_len * vocab * 4)


def lora_estimate(
    counts: LoRACounts,
    activations: ActivationProfile,
    seq_len: int,
    base_bytes: int,
    kind: str,
    micro_batch: int = 1,
    checkpointing: bool = True,
    baseline: float = 0.0,
    vocab: int | None = None,
) -> Estimate:
    """Peak memory of one step: the frozen base in ``base_bytes`` per parameter, the adapters fp32
    with gradients and AdamW's two states, activations (halved for a 16-bit base).

    With ``vocab``, the saved activations are at least the logits B·S·V in fp32 (the loss keeps
    them), whatever the short-length fit extrapolated to.
    """
    memory = ModelMemory(
        params=counts.params,
        trainable=counts.trainable,
        param_bytes=4,
        materialized_cpu_bytes=0,
        activations=activations,
        activation_scale=1.0 if base_bytes == 4 else 0.5,
    )
    est = memory.estimate(micro_batch, seq_len, kind, baseline, checkpointing=checkpointing)
    if vocab:
        est = replace(
            est, activations=max(est.activations, logits_bytes(micro_batch, seq_len, vocab))
        )
    weights = float(counts.base * base_bytes + counts.trainable * 4)
    if kind == "cpu":
        return replace(est, weights=weights)
    static = weights + est.grads + est.optimizer
    slack = DEVICE_ALLOCATOR_SLACK * (static + est.activations + est.transient)
    return replace(est, weights=weights, overhead=slack)


# ---- laptrain preflight ------------------------------------------------------------------------


def _gib(value: float) -> str:
    return f"{value / GiB:.2f} GiB ({value / GB:.2f} GB)"


def fix_list(
    model_cfg: Mapping[str, Any], seq_len: int, dtype: str, checkpointing: bool
) -> list[str]:
    """What to change when the job does not fit, one line each."""
    fixes = [f"shorter sequences: data.max_length={max(64, seq_len // 2)} (now {seq_len})"]
    if not checkpointing:
        fixes.append("gradient checkpointing: model.gradient_checkpointing=true")
    if dtype != "bfloat16":
        fixes.append("bf16 base: model.base_dtype=bfloat16 (halves the frozen weights)")
    lora = model_cfg.get("lora") or {}
    r = int(lora.get("r", 8))
    fixes.append(
        f"smaller adapter: model.lora.r={max(4, r // 2)} or model.lora.target_modules=[q_proj,v_proj]"
    )
    return fixes


@dataclass(frozen=True)
class _LoRAJob:
    """The job the report sizes: the base and its adapters, the batch, the base dtype, the budget."""

    config: Any
    lora: Mapping[str, Any]
    counts: LoRACounts
    budget: BudgetChoice
    seq_len: int
    micro: int
    setting: Any  # model.gradient_checkpointing as configured (true, false or auto)
    dtype: str
    why: str  # why base_dtype=auto chose ``dtype``; empty when it was set
    kind: str
    baseline: float
    acts: ActivationProfile
    vocab: int
    rollout: Rollout | None  # GRPO: seq_len is then the prompt's, micro the prompts per step
    auto: bool = False  # hardware.batch_size=auto picked ``micro``
    grouped: ActivationProfile | None = None  # GRPO's policy pass per group, its prompt run once

    def estimate(self, checkpointed: bool, width: int, micro: int | None = None) -> Estimate:
        """The step's peak at ``micro`` (the job's by default) with a base of ``width`` bytes; for
        GRPO the largest of its sampling, reference and policy phases (``grpo_sizing``)."""
        micro = self.micro if micro is None else micro
        vocab = None if self.rollout else self.vocab  # GRPO's logits are in its measured profile
        acts, units = self.acts, self.rollout.sequences(micro) if self.rollout else micro
        if self.grouped is not None and not checkpointed:  # checkpointing runs every prompt
            acts, units = self.grouped, micro
        est = lora_estimate(self.counts, acts, self.seq_len, width, self.kind, units,
                            checkpointed, self.baseline, vocab)  # fmt: skip
        if self.rollout is None:
            return est
        if self.kind == "cpu":
            step = (est.activations + est.transient) * GRPO_CPU_STEP_RSS
            est = replace(est, transient=step - est.activations,
                          overhead=est.overhead + TRAINING_PROCESS_RSS)  # fmt: skip
        rollout = max(
            sampling_bytes(self.config, self.rollout, micro, self.seq_len, width),
            reference_bytes(self.config, self.rollout, micro),
        )
        if rollout > est.activations + est.transient:
            est = replace(est, activations=rollout, transient=0.0)
        return est

    def estimates(self, checkpointed: bool) -> dict[str, Estimate]:
        """The step's peak with an fp32 and with a bf16 base."""
        return {name: self.estimate(checkpointed, width) for name, width in DTYPE_BYTES.items()}


@dataclass(frozen=True)
class _Choice:
    """The estimates, the one of the chosen base dtype, and whether checkpointing is on (why)."""

    estimates: dict[str, Estimate]
    chosen: Estimate
    checkpointing: bool
    auto_note: str


class _Vocabulary:
    """A tokenizer's size without the tokenizer: the offline BPE's ``data.vocab_size``."""

    bos_token_id = eos_token_id = pad_token_id = None

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def _base_config(model_cfg: Mapping[str, Any], data: Mapping[str, Any]) -> Any:
    """The base's transformers config; for ``model.tiny_base`` the offline Llama's, over the
    offline tokenizer's ``data.vocab_size``."""
    config = causal_lm_config(model_cfg)
    if config is not None:
        return config
    from laptrain.families.lora.tiny_llama import tiny_llama_config

    arch = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")
    tiny = model_cfg.get("tiny_base") or {}
    return tiny_llama_config(
        _Vocabulary(int(data.get("vocab_size") or 2048)),
        **{k: int(tiny[k]) for k in arch if k in tiny},
    )


def _asked_micro(data: Mapping[str, Any], hw: Mapping[str, Any]) -> int | None:
    """The micro batch the config asks for (prompts per step for GRPO): ``data.batch_size`` when
    it is a number, else the profile's; None for ``hardware.batch_size=auto``."""
    for value in (data.get("batch_size"), hw.get("batch_size")):
        if isinstance(value, int):
            return value
        if is_auto(value):
            return None
    return 1


def _pick_micro(job: _LoRAJob) -> int:
    """``hardware.batch_size=auto``: the largest micro batch whose estimate fits the budget (at
    least 1), with checkpointing as configured (off for ``auto``) and the configured base dtype."""
    checkpointed = False if is_auto(job.setting) else bool(job.setting)
    width = DTYPE_BYTES.get(job.dtype, 4)

    def fits(micro: int) -> bool:
        return job.estimate(checkpointed, width, micro).total <= job.budget.bytes

    low, high = 1, 2
    while fits(high) and high < MAX_AUTO_MICRO:
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def _size_job(cfg: Any, model_cfg: Any, config: Any) -> _LoRAJob:
    """The budget, the parameter counts, the batch, the base dtype and the measured activations."""
    import psutil
    from omegaconf import OmegaConf

    from laptrain.families.lora.base_dtype import choose_base_dtype

    hw = OmegaConf.to_container(cfg.hardware, resolve=True)
    budget = choose_budget(hw)
    lora = model_cfg.get("lora") or {}
    counts = count_lora(config, lora)
    data = cfg.get("data") or {}
    seq_len = int(data.get("max_length") or 512)
    rollout = rollout_of(model_cfg)
    micro = _asked_micro(data, hw)
    setting = model_cfg.get("gradient_checkpointing", False)
    dtype = str(model_cfg.get("base_dtype", "float32"))
    why = ""
    if dtype == "auto":
        dtype, why = choose_base_dtype(counts.base, budget.bytes, budget.bf16)
    kind = str(hw.get("accelerator", "cpu"))
    baseline = float(psutil.Process().memory_info().rss) if kind == "cpu" else 0.0
    grouped = None
    if rollout is None:
        acts = measure_lora_activations(config, lora)
    else:  # the longest prompt leaves max_new_tokens of data.max_length (prompt_rows refuses more)
        seq_len = max(1, seq_len - rollout.max_new_tokens)
        vocab = int(config.vocab_size)
        acts = measure_lora_activations(config, lora, make_batch=policy_batch_maker(vocab, rollout),
                                        loss_fn=policy_loss(rollout))  # fmt: skip
        if not float(lora.get("dropout") or 0.0):  # each group's prompt runs once (grpo_sampling)
            grouped = measure_lora_activations(
                config, lora, make_batch=policy_batch_maker(vocab, rollout, grouped=True),
                loss_fn=policy_loss(rollout, grouped=True),
            )  # fmt: skip
    job = _LoRAJob(config, lora, counts, budget, seq_len, micro or 1, setting, dtype, why, kind,
                   baseline, acts, int(config.vocab_size), rollout, bool(rollout) and micro is None,
                   grouped)  # fmt: skip
    return replace(job, micro=_pick_micro(job)) if job.auto else job  # GRPO's prompts only


def _chosen_estimate(job: _LoRAJob) -> _Choice:
    """The estimate of the chosen base dtype; ``gradient_checkpointing: auto`` turns checkpointing
    on only when the job does not fit without it."""
    checkpointing = False if is_auto(job.setting) else bool(job.setting)
    est = job.estimates(checkpointing)
    chosen = est[job.dtype if job.dtype in est else "float32"]
    auto_note = ""
    if is_auto(job.setting):
        auto_note = " (model.gradient_checkpointing=auto: the job fits without it)"
        if chosen.total > job.budget.bytes:
            auto_note = (
                f" (model.gradient_checkpointing=auto: without it {chosen.total / GiB:.2f} GiB > "
                f"budget {job.budget.bytes / GiB:.2f} GiB)"
            )
            checkpointing = True
            est = job.estimates(True)
            chosen = est[job.dtype if job.dtype in est else "float32"]
    return _Choice(est, chosen, checkpointing, auto_note)


def _job_lines(cfg: Any, model_cfg: Any, job: _LoRAJob, choice: _Choice) -> list[str]:
    """The report's lines on the model, its parameters, the base dtype and the job."""
    from laptrain.pretrained.loading import describe_source

    config, counts, lora = job.config, job.counts, job.lora
    micro, seq_len, vocab = job.micro, job.seq_len, job.vocab
    source = model_cfg.get("pretrained")
    pretrained = describe_source(source) if source else "backbone"
    if not source and model_cfg.get("tiny_base"):
        pretrained = "model.tiny_base (the offline Llama)"
    picked = " (hardware.batch_size=auto: the largest that fits)" if job.auto else ""
    return [
        f"model: {pretrained} ({type(config).__name__}, {config.num_hidden_layers} layers x "
        f"{config.hidden_size}, vocab {vocab}); counted on the meta device, no weights loaded",
        f"parameters: {counts.base / 1e9:.2f} B base + {counts.trainable / 1e6:.1f} M trainable "
        f"(LoRA r {lora.get('r', 8)}, targets {_targets(lora)})",
        f"base weights: fp32 {_gib(counts.base * 4)} / bf16 {_gib(counts.base * 2)}",
        f"base dtype: {job.dtype}" + (f" ({job.why})" if job.why else " (model.base_dtype)"),
        *(_rollout_lines(job, picked) if job.rollout else []),
        f"job: micro batch {micro}{'' if job.rollout else picked} x {seq_len} tokens (data={cfg.hydra.runtime.choices.get('data')}"
        f" max_length), gradient checkpointing {'on' if choice.checkpointing else 'off'}"
        f"{choice.auto_note}, {job.kind} "
        f"calibration; logits B·S·V = {micro}·{seq_len}·{vocab}: "
        f"{logits_bytes(micro, seq_len, vocab) / GiB:.2f} GiB fp32",
    ]


def _rollout_lines(job: _LoRAJob, picked: str) -> list[str]:
    """GRPO: the group and what its sampling and reference phases hold (``grpo_sizing``)."""
    rollout, prompts, prompt_len, config = job.rollout, job.micro, job.seq_len, job.config
    width = DTYPE_BYTES.get(job.dtype, 4)
    n, total = rollout.sequences(prompts), prompt_len + rollout.max_new_tokens
    cache = kv_cache_bytes(config, n, total, width)
    logits = sampling_bytes(config, rollout, prompts, prompt_len, width) - cache
    reference = reference_bytes(config, rollout, prompts)
    shared = "; each prompt run once for its group" if job.grouped is not None else ""
    return [
        f"GRPO: {prompts} prompts per step{picked} x {rollout.generations} completions = {n} "
        f"sequences of {prompt_len} prompt (data.max_length - model.max_new_tokens) + "
        f"{rollout.max_new_tokens} new tokens",
        f"rollout: KV cache {cache / GiB:.2f} GiB + next-token logits {logits / GiB:.2f} GiB "
        f"(sampling, no grad); reference pass {reference / GiB:.2f} GiB"
        f"{'' if rollout.beta else ' (model.beta=0: none)'}; the policy pass below is the "
        f"measured GRPO loss over the {n} sequences (head on the {rollout.max_new_tokens} "
        f"completion positions{shared})",
    ]


def _estimate_lines(job: _LoRAJob, choice: _Choice) -> list[str]:
    """One line per base dtype: the estimate and its parts, the chosen one marked."""
    lines = []
    base = job.counts.base
    for name, e in choice.estimates.items():
        adapters = e.grads + e.optimizer + job.counts.trainable * 4
        lines.append(
            f"estimate ({'fp32' if name == 'float32' else 'bf16'} base): {e.total / GiB:.2f} GiB = "
            f"base {base * (4 if name == 'float32' else 2) / GiB:.2f} + "
            f"adapters/grads/AdamW {adapters / GiB:.2f} + activations {e.activations / GiB:.2f} + "
            f"backward transient {e.transient / GiB:.2f} + overhead {e.overhead / GiB:.2f}"
            + ("  <- chosen" if e is choice.chosen else "")
        )
    return lines


def report(cfg: Any, model_cfg: Mapping[str, Any]) -> tuple[list[str], bool]:
    """The lines ``laptrain preflight`` prints for a LoRA job, and whether it fits (the family's
    ``sizing`` hook): ``cfg`` composed as train.py would, ``model_cfg`` its model config
    unresolved. Raises ``PreflightInputError``/``OSError`` with one line."""
    config = _base_config(model_cfg, cfg.get("data") or {})
    job = _size_job(cfg, model_cfg, config)
    choice = _chosen_estimate(job)
    budget, chosen = job.budget, choice.chosen
    fits = chosen.total <= budget.bytes
    lines = _job_lines(cfg, model_cfg, job, choice) + _estimate_lines(job, choice)
    lines.append(f"budget: {budget.bytes / GiB:.2f} GiB from {budget.source}")
    verdict = "fits" if fits else "does not fit"
    lines.append(
        f"{verdict}: {chosen.total / GiB:.2f} GiB of {budget.bytes / GiB:.2f} GiB "
        f"({job.dtype} base). Units: GiB = 2^30 bytes (GB = 10^9 in brackets). All figures are "
        f"estimates (activations measured on a {MEASURED_LAYERS}-layer full-width copy on CPU, "
        "extrapolated)"
    )
    if not fits:
        lines.append("to fit, try:")
        fixes = fix_list(model_cfg, job.seq_len, job.dtype, choice.checkpointing)
        lines.extend(f"  - {f}" for f in fixes)
    return lines, fits
