"""``model.base_dtype: auto`` for a frozen base: float32 when it fits the machine, else bfloat16.

Gap it fills: peft and transformers load a base in whatever dtype they are told; nothing looks at
the machine first. A frozen base costs only its weights (no gradients, no optimizer state), so the
rule compares the float32 weights with the memory budget the preflight will use (docs/hardware.md
§1b, §9): float32 when they take at most ``FP32_SHARE`` of it, leaving the rest for activations,
adapters and the allocator; bfloat16 otherwise (half the bytes; Llama 3.2 3B: 12.85 GB -> 6.43 GB).
The parameter count comes from the model's config on the meta device, so nothing is downloaded
but ``config.json`` and no weights are allocated.

On several ranks the decision is made once, by rank 0 (see :func:`resolve_auto_base_dtype`):
DDP needs the same weights on every rank, and ranks that each read their own free memory, at
different moments, can land on either side of the threshold.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from laptrain.ranks.environment import extra_rank, started_together

FP32_SHARE = 0.5
GiB = 1024**3
# Rank 0's choice, left in its environment for the ranks Lightning's subprocess launcher starts.
DECIDED_ENV = "LAPTRAIN_AUTO_BASE_DTYPE"


def base_parameter_count(model_cfg: Mapping[str, Any]) -> int | None:
    """Parameters of the base a causal-LM config names (hub name, folder or backbone dict)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from laptrain.families.lora.gguf_source import config_from_pretrained

    pretrained, backbone = model_cfg.get("pretrained"), model_cfg.get("backbone")
    if pretrained:
        config = config_from_pretrained(
            pretrained,
            "set model.pretrained to a folder written by save_pretrained, or "
            "model.base_dtype=float32|bfloat16",
        )
    elif backbone and "model_type" in backbone:
        fields = {k: v for k, v in backbone.items() if k != "model_type"}
        config = AutoConfig.for_model(backbone["model_type"], **fields)
    else:
        return None  # built later from tiny_base: tiny by definition
    import torch

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()  # transformers 5.0 leaves a tied head untied on the meta device
    return sum(p.numel() for p in model.parameters())


def choose_base_dtype(
    params: int | None, budget_bytes: float, bf16_supported: bool
) -> tuple[str, str]:
    """(``float32`` or ``bfloat16``, the reason in one line)."""
    if params is None:
        return "float32", "base_dtype auto: a tiny base built here, float32"
    fp32 = 4 * params
    if fp32 <= FP32_SHARE * budget_bytes:
        return "float32", (
            f"base_dtype auto: {params / 1e9:.2f}B parameters = {fp32 / GiB:.2f} GiB in float32, "
            f"within {FP32_SHARE:.0%} of the {budget_bytes / GiB:.1f} GiB budget: float32"
        )
    if not bf16_supported:
        return "float32", (
            f"base_dtype auto: float32 needs {fp32 / GiB:.2f} GiB, over {FP32_SHARE:.0%} of the "
            f"{budget_bytes / GiB:.1f} GiB budget, but this device has no native bfloat16: float32"
        )
    return "bfloat16", (
        f"base_dtype auto: {params / 1e9:.2f}B parameters = {fp32 / GiB:.2f} GiB in float32, over "
        f"{FP32_SHARE:.0%} of the {budget_bytes / GiB:.1f} GiB budget: bfloat16 "
        f"({fp32 / 2 / GiB:.2f} GiB)"
    )


def resolve_auto_base_dtype(
    model_cfg: Mapping[str, Any],
    budget_bytes: Callable[[], float],
    bf16_supported: bool,
    say: Callable[[str], None],
    environ: MutableMapping[str, str] | None = None,
    capacity_bytes: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """Constructor overrides for a model config whose ``base_dtype`` is ``auto`` (else none).

    Every rank of a job must end with the same dtype, and there is no process group yet to agree
    on one. Rank 0 builds its model before Lightning's subprocess launcher starts ranks 1..N-1,
    and the launcher gives each of them a copy of rank 0's environment
    (lightning/pytorch/strategies/launchers/subprocess_script.py:128-148). So rank 0 decides from
    its own GPU's budget, the freest reading the job gets (nothing of the job is loaded yet), and
    leaves the choice in :data:`DECIDED_ENV`; a rank that finds it there takes it instead of
    reading memory that rank 0 is by then filling. torchrun and srun start every rank at once, and
    free memory read at the same moment on different devices can still differ (another process on
    one GPU); there every rank decides from ``capacity_bytes`` (the budget rule applied to the
    device's total memory), which is the same on identical devices. :func:`check_ranks_agree`
    then compares the ranks' choices once the process group is up.
    """
    if str(model_cfg.get("base_dtype")) != "auto":
        return {}
    env = os.environ if environ is None else environ
    decided = env.get(DECIDED_ENV)
    if decided in ("float32", "bfloat16") and extra_rank(env):
        return {"base_dtype": decided}
    budget = budget_bytes
    if capacity_bytes is not None and started_together(env):
        budget = capacity_bytes
    choice, why = choose_base_dtype(base_parameter_count(model_cfg), budget(), bf16_supported)
    say(why)
    env[DECIDED_ENV] = choice
    return {"base_dtype": choice}


def check_ranks_agree(dtypes: list[str]) -> None:
    """Raise one line when the ranks of a job hold their bases in different dtypes (``dtypes``:
    every rank's, in rank order, as ``all_gather_object`` returns them): DDP would average
    gradients of different models."""
    if len(set(dtypes)) > 1:
        ranks = ", ".join(f"rank {i} {d.removeprefix('torch.')}" for i, d in enumerate(dtypes))
        raise ValueError(
            f"model.base_dtype=auto chose different dtypes on the ranks ({ranks}): set "
            "model.base_dtype=bfloat16 or model.base_dtype=float32 for every rank"
        )
