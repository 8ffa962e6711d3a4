"""GRPO on the LoRA family (issue 51): prompt rows and their refusals, the rollout, and
`python train.py experiment=grpo_offline` end to end (metrics, `laptrain generate`, every bad
input in one line, exact resume after a SIGTERM between two policy updates of one rollout)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from laptrain.commands.cli import main
from laptrain.data.file_formats import DataError
from laptrain.families.lora.prompt_rows import PromptRow, check_prompts, row_prompt
from tests.conftest import TINY_LORA
from tests.in_process import train_here
from tests.test_exact_resume import assert_same_run, run_ok, signal_at

GRPO_JOB = [
    *[a.replace("experiment=lora_offline", "experiment=grpo_offline") for a in TINY_LORA],
    "data.builder.modules=[json,csv,base64,shlex,heapq,bisect]",
    "data.builder.max_chars=80",
    "data.vocab_size=512",
    "data.batch_size=2",
    "model.num_generations=4",
    "model.max_new_tokens=6",
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
]
EXACT = "laptrain.families.lora.grpo_rewards.exact_match"
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


# ----- rows ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "row",
    [
        {"prompt": "Name it.", "answer": "x"},
        {"prompt": [{"role": "user", "content": "Name it."}], "answer": "x"},
        {"messages": [{"role": "user", "content": "Name it."}], "answer": "x"},
    ],
)
def test_every_row_shape_reads_as_the_same_prompt(row):
    found = row_prompt(row)
    assert found == PromptRow(
        [{"role": "user", "content": "Name it."}], "Name it.", {"answer": "x"}
    )


@pytest.mark.parametrize(
    "row, why",
    [
        ({"answer": "x"}, "no prompt"),
        ({"prompt": "  "}, "empty prompt"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            "messages end with an assistant turn",
        ),
    ],
)
def test_bad_rows_say_why(row, why):
    assert row_prompt(row).startswith(why)


def test_rows_missing_a_column_a_reward_reads_are_named_by_line(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": f"q{i}", "answer": "a"} for i in range(9)] + [{"prompt": "q9"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as err:
        check_prompts({"train": str(path)}, rewards=[EXACT], val_fraction=0.2, test_fraction=0.2)
    assert f"{path}:10 (no answer column, which exact_match reads)" in str(err.value)
    assert "\n" not in str(err.value)


# ----- end to end through train.py -----------------------------------------------------------
def test_train_py_grpo_offline_logs_the_rewards_writes_metrics_and_generates(tmp_path, capsys):
    done = train_here([*GRPO_JOB, "run_name=g"], tmp_path, env=ONE_THREAD)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "outputs" / "g"
    metrics = json.loads((run / "metrics.json").read_text())
    for key in ("val/reward", "test/reward", "test/reward_base", "train/reward_exact_match",
                "train/reward_length_target", "train/reward_std", "train/clip_fraction",
                "train/completion_length", "val/reward_length_target",
                "test/reward_exact_match", "test/reward_base_length_target"):  # fmt: skip
        assert 0 <= metrics[key] <= (8 if key.endswith("length") else 1), key
    assert (run / "adapter" / "adapter_config.json").is_file()
    capsys.readouterr()
    prompt = "Which `json` function does this: Serialize obj. Answer with its name only."
    assert main(["generate", str(run), "--prompt", prompt, "--max-new-tokens", "4"]) == 0


@pytest.mark.parametrize(
    "extra, words",
    [
        (["model.num_generations=1"], ["model.num_generations=1", "at least 2"]),
        (["model.loss_type=ppo"], ["model.loss_type must be one of grpo, dr_grpo, dapo"]),
        (["model.reward_weights=[1.0]"], ["model.reward_weights has 1 weights for 2"]),
        (["model.rewards=[nowhere.rewards.good]"], ["nowhere.rewards.good does not import"]),
        (["data.max_length=40"], ["leaves 34", "data.max_length - model.max_new_tokens"]),
    ],
)
def test_train_py_refuses_bad_grpo_settings_in_one_line(tmp_path, extra, words):
    done = train_here([*GRPO_JOB, *extra, "run_name=bad"], tmp_path, env=ONE_THREAD)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert all(w in last for w in words), done.stderr[-2000:]
    assert not (tmp_path / "outputs" / "bad" / "checkpoints").exists()


def _prompts_file(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_train_py_refuses_a_prompt_file_before_the_run_folder_exists(tmp_path):
    rows = [{"prompt": f"Say {i}.", "answer": str(i)} for i in range(20)] + [{"prompt": "Say."}]
    path = _prompts_file(tmp_path, rows)
    job = [a for a in GRPO_JOB if not a.startswith("data.builder")]
    args = [*job, "data=prompts", f"data.files.train={path}", "run_name=bad"]
    done = train_here(args, tmp_path, env=ONE_THREAD)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{path}:21 (no answer column, which exact_match reads)" in done.stderr.splitlines()[-1]
    assert not (tmp_path / "outputs" / "bad").exists()
    args[-1] = "model.rewards=[my_missing.rewards.f]"
    done = train_here([*args, "run_name=bad"], tmp_path, env=ONE_THREAD)
    assert done.returncode == 2 and "my_missing.rewards.f does not import" in done.stderr
    assert not (tmp_path / "outputs" / "bad").exists()


def test_a_users_reward_file_and_prompts_train(tmp_path):
    (tmp_path / "my_rewards.py").write_text(
        "def short(prompts, completions, **kwargs):\n"
        "    return [1.0 if len(c) < 6 else 0.0 for c in completions]\n"
    )
    rows = [{"prompt": f"Say {i}.", "topic": "numbers"} for i in range(20)]
    path = _prompts_file(tmp_path, rows)
    job = [a for a in GRPO_JOB if not a.startswith("data.builder")]
    args = [*job, "data=prompts", f"data.files.train={path}", "model.rewards=[my_rewards.short]"]
    done = train_here([*args, "run_name=mine"], tmp_path, env={**ONE_THREAD, "PYTHONPATH": "."})
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "outputs" / "mine" / "metrics.json").read_text())
    assert "test/reward_base" in json.dumps(metrics)


def test_laptrain_new_rewards_writes_rewards_a_grpo_run_of_the_clone_trains_on(tmp_path):
    from tests.new_project import copy_clone, laptrain

    clone = copy_clone(tmp_path / "clone")
    done = laptrain("new", "my_task", "--rewards", "--root", str(clone))
    assert done.returncode == 0, done.stderr
    assert "wrote user/my_task/rewards.py" in done.stdout
    rows = [{"prompt": f"What is {i} + 1? Answer with the number only.", "answer": str(i + 1)}
            for i in range(20)]  # fmt: skip
    path = _prompts_file(clone, rows)
    job = [a for a in GRPO_JOB if not a.startswith("data.builder")]
    rewards = "model.rewards=[user.my_task.rewards.correct,user.my_task.rewards.brief]"
    args = [*job, "data=prompts", f"data.files.train={path}", rewards, "run_name=mine"]
    done = train_here(args, clone, env=ONE_THREAD, script=clone / "train.py")
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((clone / "outputs" / "mine" / "metrics.json").read_text())
    assert 0 <= metrics["test/reward_base_brief"] <= 1 and "test/reward_correct" in metrics


def test_grpo_stopped_between_two_updates_of_a_rollout_resumes_bit_identical(tmp_path):
    """num_iterations=2: step 3 is the first update of the second rollout; SIGTERM there leaves
    the rollout buffer, its use count and the sampling generator in the checkpoint, and the rerun
    ends with the straight run's adapter, AdamW moments and step, tensor for tensor."""
    args = [*GRPO_JOB, "model.num_iterations=2", "model.lora.dropout=0.1", "test=false"]
    run_ok([*args, "run_name=straight"], tmp_path)
    run_ok([*args, "run_name=stopped", *signal_at("SIGTERM", step=3)], tmp_path, 143)
    ckpt = tmp_path / "outputs" / "stopped" / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert saved["global_step"] == 3 and saved["laptrain_grpo"]["ranks"][0]["rollout_uses"] == 1
    assert "global step 3," in run_ok([*args, "run_name=stopped"], tmp_path)
    assert_same_run(tmp_path, "straight", "stopped")


def test_the_bundled_prompts_offer_the_answer_among_names_of_its_module(tmp_path):
    from laptrain.families.lora.prompts import build_stdlib_prompts

    modules = ["json", "heapq", "shlex"]
    path = build_stdlib_prompts(str(tmp_path), modules, max_chars=120)["all"]
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    names: dict[str, set[str]] = {}
    for row in rows:  # a package's submodules (json.decoder) are modules of their own
        names.setdefault(row["module"], set()).add(row["answer"])
    for row in rows:
        assert row["answer"] in row["options"] and len(set(row["options"])) == len(row["options"])
        assert len(row["options"]) == min(4, len(names[row["module"]]))
        assert set(row["options"]) <= names[row["module"]]
        assert f"Options: {', '.join(row['options'])}." in row["prompt"]
    assert len({r["options"].index(r["answer"]) for r in rows}) > 1  # not always first
    again = build_stdlib_prompts(str(tmp_path / "again"), modules, max_chars=120)["all"]
    assert Path(again).read_text() == Path(path).read_text()


@pytest.mark.slow
def test_grpo_offline_raises_the_held_out_reward_over_the_base(tmp_path):
    """The preset as shipped (60 steps of 4 prompts x 8 completions on the tiny Llama): the
    held-out greedy reward ends above the base's (measured in docs/grpo.md)."""
    done = train_here(["experiment=grpo_offline", "hardware=cpu", "run_name=r"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "outputs" / "r" / "metrics.json").read_text())
    assert metrics["test/reward"] >= metrics["test/reward_base"] + 0.2, metrics


def test_the_preflight_measures_the_rollout_of_every_generation(tmp_path):
    """hardware.batch_size=auto: the preflight measures the module's own step (num_generations
    full-length completions per prompt sampled with the KV cache, then the policy pass), so a
    prompt costs more with more generations (one sequence per example before); less than 4x from
    2 to 8, as each group's prompt runs once."""
    args = [*GRPO_JOB, "hardware.batch_size=auto", "data.batch_size=from_profile",
            "trainer.max_steps=1", "trainer.limit_val_batches=0", "test=false"]  # fmt: skip
    per_prompt = {}
    for group in (2, 8):
        run = f"g{group}"
        done = train_here([*args, f"model.num_generations={group}", f"run_name={run}"], tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        plan = json.loads((tmp_path / "outputs" / run / "preflight.json").read_text())
        per_prompt[group] = plan["estimate"]["activations"] / plan["micro_batch"]
    assert 4 * per_prompt[2] > per_prompt[8] > 1.5 * per_prompt[2], per_prompt
