"""GRPO on several processes (issue 51, item 7): 2 CPU ranks (`trainer=ddp_cpu`, gloo) at B
prompts per step each roll out their own prompts, sample what one process at 2B samples, keep
each prompt's group statistics within its group and end with its adapter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from laptrain.families.lora.grpo_sampling import prompt_generators, sample
from tests.in_process import train_here
from tests.test_exact_resume import HOOKS, assert_same_run, load
from tests.test_grpo import GRPO_JOB
from tests.test_lora_resume import final_weights, train


class RecordRollouts(pl.Callback):
    """Write ``<folder>/rank<r>.json``: per optimizer step, each prompt (its text), its group's
    completions (token ids up to the stop) and advantages."""

    def __init__(self, folder: str) -> None:
        self.folder, self.steps = folder, []

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, outputs, batch, i) -> None:
        rollout, group = module._rollout, module.num_generations
        ids, mask = rollout["completion_ids"].tolist(), rollout["completion_mask"].tolist()
        prompts = []
        for p, prompt in enumerate(batch["prompts"]):
            rows = range(p * group, (p + 1) * group)
            prompts.append(
                {
                    "prompt": prompt,
                    "completions": [[t for t, m in zip(ids[r], mask[r]) if m] for r in rows],
                    "advantages": rollout["advantages"][rows.start : rows.stop].tolist(),
                }
            )
        self.steps.append(prompts)

    def on_train_end(self, trainer: pl.Trainer, module: Any) -> None:
        path = Path(self.folder) / f"rank{trainer.global_rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.steps))


def record(folder: Path) -> list[str]:
    return [
        f"+callbacks.record._target_={__name__}.RecordRollouts",
        f"+callbacks.record.folder={folder}",
    ]


def by_prompt(folder: Path) -> tuple[list[dict[str, Any]], list[list[set[str]]]]:
    """Per step, each prompt's record over all ranks; and per step, each rank's prompts."""
    ranks = [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))]
    steps = range(len(ranks[0]))
    merged = [{p["prompt"]: p for rank in ranks for p in rank[s]} for s in steps]
    return merged, [[{p["prompt"] for p in rank[s]} for rank in ranks] for s in steps]


def test_a_prompts_completions_do_not_depend_on_the_other_prompts_of_its_batch():
    """The fast twin of the DDP run below: a prompt sampled alone (its rank's batch) draws the
    completions it draws beside a longer prompt (one process's batch, left-padded wider)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    long, short = torch.randint(1, 64, (7,)), torch.randint(1, 64, (3,))
    both = torch.stack([long, torch.cat([torch.zeros(4, dtype=torch.long), short])])
    both_mask = torch.tensor([[1] * 7, [0] * 4 + [1] * 3])

    def draw(ids: torch.Tensor, mask: torch.Tensor, rows: list[int]) -> torch.Tensor:
        group = 4
        done, _ = sample(model, ids.repeat_interleave(group, 0), mask.repeat_interleave(group, 0),
                         8, [-1], 0, prompt_generators(3, 0, rows), temperature=1.0)  # fmt: skip
        return done.view(len(rows), group, -1)

    together = draw(both, both_mask, [10, 11])
    alone = draw(short[None], torch.ones(1, 3, dtype=torch.long), [11])
    assert torch.equal(together[1], alone[0])
    assert not torch.equal(together[0], together[1])  # each prompt its own stream
    assert len({tuple(c.tolist()) for c in alone[0]}) > 1  # and its group's completions differ


def test_two_grpo_ranks_roll_out_their_own_prompts_and_end_where_one_process_ends(tmp_path):
    """2 ranks x 2 prompts sample, score and normalise each prompt's group as 1 process x 4
    prompts does, and the adapter after 4 steps is the same within 1e-5 (dapo: the loss divides by
    the step's completion tokens of both ranks). LoRA dropout off: each rank draws its own masks."""
    job = [*GRPO_JOB, "model.lora.dropout=0", "test=false", "trainer.limit_val_batches=0"]
    two = train([*job, "run_name=two", "trainer=ddp_cpu", *record(tmp_path / "two")], tmp_path)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "effective batch size: 4" in two.stdout
    one_args = [*job, "run_name=one", "data.batch_size=4", *record(tmp_path / "one")]
    one = train_here(one_args, tmp_path, env=HOOKS)
    assert one.returncode == 0, one.stderr[-3000:]

    two_steps, two_prompts = by_prompt(tmp_path / "two")
    one_steps, _ = by_prompt(tmp_path / "one")
    assert len(two_steps) == len(one_steps) == 4
    for step, (first, second) in enumerate(two_prompts):  # each rank its own prompts
        assert first | second == one_steps[step].keys(), step
        if len(one_steps[step]) > 1:  # (a last batch of 1 prompt goes to both ranks)
            assert first and second and not first & second, step
    for step, (got, want) in enumerate(zip(two_steps, one_steps)):
        for prompt, group in want.items():
            assert got[prompt]["completions"] == group["completions"], (step, prompt)
            advantages = torch.tensor(got[prompt]["advantages"])
            assert torch.allclose(advantages, torch.tensor(group["advantages"])), (step, prompt)
            assert abs(advantages.mean().item()) < 1e-5, (step, prompt)  # within the group
    assert any(a != 0 for s in one_steps for p in s.values() for a in p["advantages"])

    two_w, _, two_step = final_weights(tmp_path / "outputs" / "two")
    one_w, _, one_step = final_weights(tmp_path / "outputs" / "one")
    assert two_step == one_step == 4 and one_w.keys() == two_w.keys()
    assert max(w.abs().max().item() for k, w in one_w.items() if "lora_B" in k) > 1e-4
    worst = max((one_w[k].double() - two_w[k].double()).abs().max().item() for k in one_w)
    assert worst < 1e-5, worst


@pytest.mark.slow  # ~55 s (three 2-process runs); the single-process twin is in test_grpo.py
def test_a_paused_two_rank_grpo_run_resumes_each_ranks_rollout_to_the_unpaused_run(tmp_path):
    """num_iterations=2 on 2 ranks, LoRA dropout on: a session budget spent at once pauses the run
    after step 1, the first of two policy updates on each rank's own rollout; the checkpoint holds
    both ranks' rollouts, and the rerun ends with the straight run's adapter, AdamW moments and
    step, tensor for tensor."""
    # 3 prompts per rank: no global batch of this split is a single prompt, which both ranks get
    job = [*GRPO_JOB, "trainer=ddp_cpu", "data.batch_size=3", "model.num_iterations=2",
           "model.lora.dropout=0.1", "test=false", "trainer.limit_val_batches=0",
           "trainer.max_steps=2"]  # fmt: skip
    straight = train([*job, "run_name=straight"], tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    budget = "callbacks.session_budget.max_minutes=0.00001"
    paused = train([*job, "run_name=paused", budget], tmp_path)
    # ddp_spawn's main process exits 0 here: the stop reason (exit 75) stays in the rank processes
    assert "budget (1e-05 min) is used at step 1" in paused.stdout + paused.stderr, paused.stderr
    saved = load(tmp_path / "outputs" / "paused" / "checkpoints" / "last.ckpt")
    ranks = saved["laptrain_grpo"]["ranks"]
    assert saved["global_step"] == 1 and [r["rollout_uses"] for r in ranks] == [1, 1]
    first, second = (r["rollout"]["prompt_ids"] for r in ranks)
    assert first.shape != second.shape or not torch.equal(first, second)  # each rank its own
    resumed = train([*job, "run_name=paused"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "global step 1," in resumed.stdout
    assert_same_run(tmp_path, "straight", "paused")
