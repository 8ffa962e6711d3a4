"""model.base_dtype=auto: float32 when the frozen base fits half the budget, else bfloat16."""

from __future__ import annotations

from laptrain.model.lora.base_dtype import (
    GB,
    base_parameter_count,
    choose_base_dtype,
    resolve_auto_base_dtype,
)
from laptrain.preflight.from_config import LLAMA32_3B


def test_llama_32_3b_is_counted_on_the_meta_device_without_weights():
    assert (
        base_parameter_count({"backbone": {"model_type": "llama", **LLAMA32_3B}}) == 3_212_749_824
    )


def test_a_16_gb_mac_gets_a_bfloat16_base_and_a_64_gb_one_float32():
    params = 3_212_749_824  # 12.85 GB in float32
    budget_16 = 0.65 * 0.75 * 16 * GB  # Apple profile: 0.65 x recommended (~75 % of RAM)
    choice, why = choose_base_dtype(params, budget_16, bf16_supported=True)
    assert choice == "bfloat16" and "11.97 GB in float32" in why and "5.98 GB" in why
    assert choose_base_dtype(params, 0.65 * 0.75 * 64 * GB, True)[0] == "float32"
    assert choose_base_dtype(params, budget_16, bf16_supported=False)[0] == "float32"


def test_only_auto_is_decided_and_the_reason_is_said_once():
    said: list[str] = []
    assert resolve_auto_base_dtype({"base_dtype": "float32"}, lambda: 1.0, True, said.append) == {}
    decided = resolve_auto_base_dtype(
        {"base_dtype": "auto", "backbone": {"model_type": "llama", **LLAMA32_3B}},
        lambda: 7.8 * GB,
        True,
        said.append,
    )
    assert decided == {"base_dtype": "bfloat16"} and len(said) == 1
    tiny = resolve_auto_base_dtype({"base_dtype": "auto"}, lambda: 1.0, True, said.append)
    assert tiny == {"base_dtype": "float32"}
