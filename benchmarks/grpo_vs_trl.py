"""GRPO on the CPU: laptrain against TRL 1.16's GRPOTrainer + peft, in completion tokens/s and
optimizer steps/s.

    python benchmarks/grpo_vs_trl.py                          # experiment=grpo_smollm2
    python benchmarks/grpo_vs_trl.py --repeats 2 --steps 4
    python benchmarks/grpo_vs_trl.py --smoke                  # tiny offline Llama (tests)

Both arms train the job of ``python train.py experiment=grpo_smollm2 hardware=cpu`` (``--smoke``:
``experiment=grpo_offline`` cut small): the same base in float32, the same LoRA (peft
``LoraConfig`` with the preset's rank, alpha, dropout and target modules), ``num_generations``,
prompts per step (``data.batch_size``; one generation per optimizer step in both), ``max_new_tokens``
(TRL's ``max_completion_length``), temperature, top-p, ``loss_type``, ``beta``, ``epsilon``,
``num_iterations``, learning rate, cosine schedule and warmup, no gradient clipping, the same
prompt tokens (laptrain's train split decoded to text; each checked to tokenize back to the same
ids, a BOS the tokenizer adds itself left out of the text) and the same reward functions. No vLLM.

Equal work per step: both arms generate every completion to its full ``max_new_tokens``
(laptrain's stop ids replaced by none, TRL's ``min_new_tokens`` masking EOS), so each step samples
and trains on prompts x ``num_generations`` x ``max_new_tokens`` completion tokens in both, and
the tokens/s and steps/s ratios agree. Counted: non-pad ``completion_mask`` of each new rollout
here, ``len(completion_ids)`` of each reward call there.

What differs is each side's own machinery, at its defaults: laptrain samples with its KV-cache loop
(one CPU generator per prompt), the Lightning loop, the head on completion positions and fused
AdamW; TRL samples with transformers' ``generate`` and trains in the HF Trainer with its default
optimizer (``adamw_torch_fused`` on torch >= 2.8), prompts shuffled by its sampler. The rewards
score different completions (different random streams); the work they cost is not timed apart.
Each arm runs in a fresh process, ``--repeats`` rounds with the order rotated; the first
``--warmup`` steps are not timed; the table gives medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from arms import tiny_lora_smoke

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("laptrain", "trl")
GOAL = 1.1  # laptrain / TRL (issue 51 item 8)
JOB = ["experiment=grpo_smollm2", "hardware=cpu"]
SMOKE = tiny_lora_smoke("grpo_offline", "model.num_generations=4", "data.batch_size=2")


def overrides(args: argparse.Namespace) -> list[str]:
    return [*(SMOKE if args.smoke else JOB), "model.gradient_checkpointing=false", *args.set]


def run_laptrain(args: argparse.Namespace, folder: Path) -> tuple[list[float], list[int]]:
    import lightning.pytorch as pl

    from laptrain.commands.bench import build_job, make_trainer
    from laptrain.families.lora.grpo import GRPOLoRAModule

    ends, tokens = [], []

    class StepEnds(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            ends.append(time.perf_counter())
            new = pl_module._rollout_uses == 1  # a step that sampled (num_iterations > 1 reuses)
            tokens.append(int(pl_module._rollout["completion_mask"].sum()) if new else 0)

    GRPOLoRAModule._stop_ids = lambda self: [-1]  # full length: no id is -1
    job = build_job(overrides(args), folder, lambda _: None)
    trainer = make_trainer(job, args.warmup + args.steps, [StepEnds()], num_sanity_val_steps=0)
    trainer.fit(job.model, datamodule=job.datamodule)
    return ends, tokens


def prompt_texts(tokenizer: Any, prompt_ids: list[list[int]]) -> list[str]:
    """Texts that ``tokenizer(text)`` (TRL's tokenization of a text prompt) turns back into
    exactly ``prompt_ids``: a BOS the tokenizer adds itself is left out of the text."""
    adds_bos = tokenizer("x")["input_ids"][:1] == [tokenizer.bos_token_id]
    texts = []
    for ids in prompt_ids:
        ids = list(ids)
        text = tokenizer.decode(
            ids[1:] if adds_bos and ids[:1] == [tokenizer.bos_token_id] else ids
        )
        if tokenizer(text)["input_ids"] != ids:
            raise SystemExit(f"prompt {len(texts)}: its decoded text does not tokenize back to it")
        texts.append(text)
    return texts


def run_trl(args: argparse.Namespace, folder: Path) -> tuple[list[float], list[int]]:
    import datasets
    import lightning.pytorch as pl
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from laptrain.commands.bench import compose_job
    from laptrain.families.lora.causal_lm import load_base, with_tiny_base
    from laptrain.families.lora.grpo_rewards import load_rewards

    datasets.disable_progress_bars()
    cfg, _ = compose_job(overrides(args), folder, lambda _: None)
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    data = instantiate(cfg.data, _convert_="all")
    data.prepare_data()
    data.setup("fit")
    model = OmegaConf.to_container(cfg.model, resolve=True)
    pretrained = with_tiny_base(model.get("pretrained"), model.get("tiny_base"), data.tokenizer)
    base = load_base(pretrained, None, torch.float32)
    train = data.splits["train"]
    tokenizer = data.tokenizer
    columns = [json.loads(c) for c in train["columns"]]
    rows = {"prompt": prompt_texts(tokenizer, train["prompt_ids"])}
    for name in columns[0]:
        rows[name] = [c[name] for c in columns]
    tokens: list[int] = []
    rewards = load_rewards(list(model["rewards"]), model.get("reward_weights"))

    def reward(i: int):
        def call(prompts, completions, completion_ids=None, **kwargs):
            if i == 0:
                tokens.append(sum(len(c) for c in completion_ids))
            kept = {k: v for k, v in kwargs.items() if k in columns[0]}
            return rewards[i].fn(prompts, completions, **kept)

        call.__name__ = f"reward_{i}"
        return call

    lora = model["lora"]
    peft_config = LoraConfig(
        r=int(lora["r"]), lora_alpha=int(lora["alpha"]), lora_dropout=float(lora["dropout"]),
        target_modules=lora["target_modules"], bias="none", task_type="CAUSAL_LM",
    )  # fmt: skip
    prompts, group = int(data.batch_size), int(model["num_generations"])
    config = GRPOConfig(
        output_dir=str(folder / "trl"), per_device_train_batch_size=prompts * group,
        num_generations=group, max_completion_length=int(model["max_new_tokens"]),
        temperature=float(model["temperature"]), top_p=float(model["top_p"]),
        loss_type=model["loss_type"], beta=float(model["beta"]), epsilon=float(model["epsilon"]),
        learning_rate=float(model["optimizer"]["lr"]), weight_decay=0.0, max_grad_norm=0.0,
        lr_scheduler_type="cosine", warmup_steps=float(model.get("warmup_ratio", 0.0)),
        max_steps=args.warmup + args.steps, num_iterations=int(model["num_iterations"]),
        reward_weights=[r.weight for r in rewards], bf16=False,
        generation_kwargs={"min_new_tokens": int(model["max_new_tokens"])},  # full length
        use_cpu=True, report_to=[], logging_steps=1, disable_tqdm=True, save_strategy="no",
        seed=int(cfg.seed), gradient_checkpointing=False,
    )  # fmt: skip
    ends: list[float] = []

    class StepEnds(TrainerCallback):
        def on_step_end(self, *a: Any, **k: Any) -> None:
            ends.append(time.perf_counter())

    trainer = GRPOTrainer(
        model=base, reward_funcs=[reward(i) for i in range(len(rewards))],
        args=config, train_dataset=datasets.Dataset.from_dict(rows),
        processing_class=tokenizer, peft_config=peft_config, callbacks=[StepEnds()],
    )  # fmt: skip
    trainer.train()
    return ends, tokens


def child(args: argparse.Namespace) -> None:
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        run = run_laptrain if args.child == "laptrain" else run_trl
        ends, tokens = run(args, Path(tmp))
    timed, counted = ends[args.warmup :], tokens[args.warmup + 1 : len(ends)]
    wall = timed[-1] - timed[0]
    steps = len(timed) - 1
    print(
        json.dumps(
            {
                "steps_per_s": steps / wall,
                "tokens_per_s": sum(counted) / wall,
                "threads": torch.get_num_threads(),
            }
        )
    )


def run_arm(args: argparse.Namespace, arm: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", arm, "--steps", str(args.steps)]
    command += ["--warmup", str(args.warmup), *(["--smoke"] if args.smoke else [])]
    command += [f"--set={s}" for s in args.set]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{arm} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def benchmark(args: argparse.Namespace) -> None:
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    start = time.time()
    for round_ in range(args.repeats):
        order = ARMS[round_ % 2 :] + ARMS[: round_ % 2]
        for arm in order:
            results[arm].append(run_arm(args, arm))
            print(arm, json.dumps(results[arm][-1]), file=sys.stderr)
    from arms import machine_line

    print(machine_line())
    print(
        f"`python benchmarks/grpo_vs_trl.py{' --smoke' if args.smoke else ''} --repeats "
        f"{args.repeats} --steps {args.steps}` ({' '.join(overrides(args))}), "
        f"{time.time() - start:.0f} s, medians\n"
    )
    med = {a: {k: statistics.median(r[k] for r in results[a]) for k in results[a][0]} for a in ARMS}
    print("| arm | completion tokens/s | optimizer steps/s |")
    print("|---|---|---|")
    print(
        f"| laptrain | {med['laptrain']['tokens_per_s']:.1f} | {med['laptrain']['steps_per_s']:.3f} |"
    )
    print(
        f"| TRL GRPOTrainer + peft | {med['trl']['tokens_per_s']:.1f} | {med['trl']['steps_per_s']:.3f} |"
    )
    tokens = med["laptrain"]["tokens_per_s"] / med["trl"]["tokens_per_s"]
    steps = med["laptrain"]["steps_per_s"] / med["trl"]["steps_per_s"]
    print(f"| laptrain / TRL | {tokens:.2f}x | {steps:.2f}x (goal >= {GOAL}x) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="timed optimizer steps per arm")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="the tiny offline Llama, seconds")
    parser.add_argument("--set", action="append", default=[], help="an override for both arms")
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    (child if args.child else benchmark)(args)


if __name__ == "__main__":
    main()
