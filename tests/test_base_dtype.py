"""model.base_dtype=auto: float32 when the frozen base fits half the budget, else bfloat16."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from laptrain.families.lora.base_dtype import (
    DECIDED_ENV,
    GiB,
    base_parameter_count,
    check_ranks_agree,
    choose_base_dtype,
    resolve_auto_base_dtype,
)
from laptrain.families.lora.sizing import LLAMA32_3B
from laptrain.preflight.budget import capacity_budget
from laptrain.ranks.environment import started_together

LLAMA_AUTO = {"base_dtype": "auto", "backbone": {"model_type": "llama", **LLAMA32_3B}}


def test_llama_32_3b_is_counted_on_the_meta_device_without_weights():
    assert (
        base_parameter_count({"backbone": {"model_type": "llama", **LLAMA32_3B}}) == 3_212_749_824
    )


def test_a_16_gb_mac_gets_a_bfloat16_base_and_a_64_gb_one_float32():
    params = 3_212_749_824  # 12.85 GB in float32
    budget_16 = 0.65 * 0.75 * 16 * GiB  # Apple profile: 0.65 x recommended (~75 % of RAM)
    choice, why = choose_base_dtype(params, budget_16, bf16_supported=True)
    assert choice == "bfloat16" and "11.97 GiB in float32" in why and "5.98 GiB" in why
    assert choose_base_dtype(params, 0.65 * 0.75 * 64 * GiB, True)[0] == "float32"
    assert choose_base_dtype(params, budget_16, bf16_supported=False)[0] == "float32"


def test_only_auto_is_decided_and_the_reason_is_said_once():
    said: list[str] = []
    env: dict[str, str] = {}
    fixed = resolve_auto_base_dtype({"base_dtype": "float32"}, lambda: 1.0, True, said.append, env)
    assert fixed == {}
    decided = resolve_auto_base_dtype(LLAMA_AUTO, lambda: 7.8 * GiB, True, said.append, env)
    assert decided == {"base_dtype": "bfloat16"} and len(said) == 1
    tiny = resolve_auto_base_dtype({"base_dtype": "auto"}, lambda: 1.0, True, said.append, env)
    assert tiny == {"base_dtype": "float32"}


def test_every_rank_of_a_ddp_job_ends_with_rank_0s_dtype_whatever_its_own_gpu_has_free():
    """Rank 0 decides on its GPU's free memory before it starts the other ranks; Lightning's
    launcher copies its environment into them. Rank 1 alone would read less free memory (rank 0
    is loading by then) and pick bfloat16: a base in two dtypes across the ranks of one job."""
    free = {0: 30 * GiB, 1: 20 * GiB}  # Llama 3.2 3B is 12.85 GB in float32; 0.9 of free memory
    read: list[int] = []

    def budget(gpu: int):
        return lambda: read.append(gpu) or 0.9 * free[gpu]

    rank_0_env: dict[str, str] = {}  # no LOCAL_RANK: rank 0 runs before the launcher sets it
    rank_0 = resolve_auto_base_dtype(LLAMA_AUTO, budget(0), True, lambda _: None, rank_0_env)
    rank_1_env = {**rank_0_env, "LOCAL_RANK": "1", "WORLD_SIZE": "2"}  # as the launcher starts it
    rank_1 = resolve_auto_base_dtype(LLAMA_AUTO, budget(1), True, lambda _: None, rank_1_env)
    assert rank_0 == rank_1 == {"base_dtype": "float32"} and read == [0]
    # the next job of a sweep, in rank 0's process: decided again, not taken from the last one
    again = resolve_auto_base_dtype(LLAMA_AUTO, budget(1), True, lambda _: None, rank_0_env)
    assert again == {"base_dtype": "bfloat16"} and rank_0_env[DECIDED_ENV] == "bfloat16"


def test_torchrun_ranks_decide_on_total_memory_so_a_busy_gpu_does_not_split_them():
    """torchrun and srun start every rank at once: no rank can hand its choice to the others. Each
    decides on its device's total memory (the same on identical GPUs), not on what is free: GPU 1
    shares 12 GiB with another process here, and on free memory alone its rank would pick bfloat16
    while rank 0 picks float32."""
    free, total = {0: 30 * GiB, 1: 18 * GiB}, 32 * GiB
    for launcher in ({"WORLD_SIZE": "2"}, {"SLURM_NTASKS": "2"}):
        chosen = []
        for rank in (0, 1):
            env = {**launcher, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            chosen.append(
                resolve_auto_base_dtype(
                    LLAMA_AUTO,
                    lambda rank=rank: 0.9 * free[rank],
                    True,
                    lambda _: None,
                    env,
                    capacity_bytes=lambda: 0.9 * total,
                )
            )
        assert chosen == [{"base_dtype": "float32"}] * 2, launcher
    # one process (or Lightning's launcher, before it starts rank 1): what is free now
    alone = resolve_auto_base_dtype(
        LLAMA_AUTO, lambda: 0.9 * free[1], True, lambda _: None, {}, capacity_bytes=lambda: 1e12
    )
    assert alone == {"base_dtype": "bfloat16"}
    assert not started_together({"WORLD_SIZE": "1"}) and not started_together({"WORLD_SIZE": "x"})


def test_ranks_holding_different_dtypes_stop_in_one_line_naming_the_fix():
    check_ranks_agree(["torch.float32", "torch.float32"])
    with pytest.raises(ValueError) as err:
        check_ranks_agree(["float32", "bfloat16"])
    line = str(err.value)
    assert "\n" not in line and "rank 0 float32, rank 1 bfloat16" in line
    assert "model.base_dtype=bfloat16" in line


def test_the_capacity_budget_reads_total_memory_and_a_fixed_budget_wins():
    reading = SimpleNamespace(
        device_limit=80 * GiB, system_total=64 * GiB, system_available=9 * GiB
    )
    probe = SimpleNamespace(kind="cuda", memory=lambda: reading)
    assert capacity_budget(probe, 0.9) == 0.9 * 80 * GiB
    assert capacity_budget(probe, 0.9, memory_budget_gb=20) == 20 * GiB
    cpu = SimpleNamespace(kind="cpu", memory=lambda: reading)
    assert capacity_budget(cpu, 0.5) == 32 * GiB
