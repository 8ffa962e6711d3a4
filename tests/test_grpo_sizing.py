"""``laptrain preflight experiment=grpo_offline``: the estimate from the config counts the rollout."""

import re

import psutil
from omegaconf import OmegaConf

from laptrain.families.lora.grpo_sizing import Rollout, kv_cache_bytes, sampling_bytes
from laptrain.families.lora.sizing import _base_config
from laptrain.preflight.from_config import preflight_report
from tests.conftest import CONF

GiB = 1024**3
JOB = ["experiment=grpo_offline", "hardware=cpu", "data.max_length=95"]


def test_the_tiny_grpo_job_counts_its_kv_cache_by_hand():
    """The offline Llama (2 layers, 2 kv heads of 128 / 4 = 32 dims, fp32): 2 x 2 x 2 x 32 x 4 =
    1024 bytes per token; 4 prompts x 8 completions of 87 + 8 tokens = 3,112,960 bytes."""
    model = OmegaConf.to_container(OmegaConf.load(CONF / "model" / "tiny_llama_grpo.yaml"))
    model["tiny_base"] = OmegaConf.to_container(
        OmegaConf.load(CONF / "model" / "tiny_llama_lora.yaml")
    )["tiny_base"]
    config = _base_config(model, {"vocab_size": 2048})
    assert kv_cache_bytes(config, 4 * 8, 87 + 8, 4) == 32 * 95 * 1024 == 3_112_960
    # sampling adds one position's fp32 logits per sequence (logits_to_keep=1), not 87
    assert sampling_bytes(config, Rollout(8, 8, 0.0, 1.0), 4, 87, 4) == 3_112_960 + 32 * 2048 * 4

    lines, fits = preflight_report(JOB)
    assert fits
    text = "\n".join(lines)
    assert "GRPO: 4 prompts per step x 8 completions = 32 sequences of 87 prompt" in text
    assert "head on the 8 completion positions" in text


def _prompts_at(budget_gib: float) -> int:
    job = [*JOB, "data.batch_size=from_profile", "hardware.batch_size=auto"]
    lines, fits = preflight_report([*job, f"hardware.memory_budget_gb={budget_gib:.2f}"])
    assert fits, lines
    found = re.search(r"GRPO: (\d+) prompts per step \(hardware.batch_size=auto", "\n".join(lines))
    assert found, lines
    return int(found.group(1))


def test_batch_size_auto_picks_more_prompts_per_step_from_a_larger_budget():
    here = psutil.Process().memory_info().rss / GiB + 0.4  # this process, plus train.py's extra
    small, large = _prompts_at(here + 0.3), _prompts_at(here + 1.5)
    assert 1 <= small < large
