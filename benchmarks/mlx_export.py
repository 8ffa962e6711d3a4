"""A LoRA run exported for mlx-lm and run in mlx-lm itself: agreement with the merged model.

    pip install -e '.[mlx]'                # mlx[cpu] on Linux: the check runs on any CPU
    python benchmarks/mlx_export.py --run outputs/<a lora_smollm2 run>
    python benchmarks/mlx_export.py        # trains `experiment=lora_smollm2` first (20 steps)
    python benchmarks/mlx_export.py --run R --work W --max-seconds 150   # again until the table

mlx's CPU backend (Linux) scores about 8 positions a second for this 135 M model (2 shared cores),
so on a shared machine ``--work`` keeps the exports and the scores made so far and
``--max-seconds`` stops scoring in time: rerun the same line until it prints the table.

``laptrain export <run> --format mlx`` (the adapter) and ``--format mlx --fuse`` (the fused model)
are timed; mlx-lm loads them (``mlx_lm.load(base, adapter_path=...)``, ``mlx_lm.load(fused)``) and
every held-out text (the chat rendering of "What does `x.f` do?" -> its docstring's first sentence,
for standard-library modules the preset never trains on) is scored at every position by the fused
model in mlx-lm and by the merged transformers model in float32, on the same token ids. Printed:
top-1 next-token agreement and the largest |logit difference| (fused vs transformers; adapter vs
fused), then five greedy replies side by side (each formatted by its own chat template).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "What does `json.dumps` do?",
    "What does `shutil.copytree` do?",
    "What does `secrets.token_hex` do?",
    "What does `hashlib.sha256` do?",
    "What does `os.path.join` do?",
]


def train(folder: Path, steps: int) -> Path:
    command = [sys.executable, str(ROOT / "train.py"), "experiment=lora_smollm2", "run_name=mlx",
               f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "test=false"]  # fmt: skip
    subprocess.run(command, cwd=folder, check=True)
    return folder / "outputs" / "mlx"


def export(laptrain, run: Path, out: Path, *extra: str) -> float:
    """Seconds ``laptrain export`` took (0 when ``out`` is there from an earlier call)."""
    if out.is_dir():
        return 0.0
    start = time.perf_counter()
    assert laptrain(["export", str(run), "--out", str(out), *extra]) == 0
    return time.perf_counter() - start


def logits_of(model, ids: list[int]):
    import mlx.core as mx
    import numpy as np

    return np.array(model(mx.array([ids]))[0].astype(mx.float32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None, help="a LoRA run folder")
    parser.add_argument("--steps", type=int, default=20, help="training steps without --run")
    parser.add_argument("--texts", type=int, default=40, help="held-out texts scored")
    parser.add_argument("--adapter-texts", type=int, default=3, help="of them, adapter vs fused")
    parser.add_argument("--work", type=Path, default=Path("mlx-bench"), help="exports, scores")
    parser.add_argument("--max-seconds", type=float, default=None, help="stop scoring after")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()

    import numpy as np
    import torch
    from arms import machine_line
    from mlx_lm import generate, load
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from laptrain.commands.cli import main as laptrain
    from laptrain.console import no_transformers_bars, quiet_libraries
    from laptrain.families.lora.gguf.llama_cpp_check import held_out_texts
    from laptrain.families.lora.mlx_export import rope_keys
    from laptrain.families.lora.tools import base_name_of, end_of_turn_ids, find_adapter

    quiet_libraries()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    run = args.run or train(work, args.steps)
    base = base_name_of(find_adapter(run))
    merged_dir, adapter_dir, fused_dir = (work / n for n in ("merged", "mlx", "fused"))
    export(laptrain, run, merged_dir, "--dtype", "float32")
    state_file = work / "scores.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {"texts": []}
    state.setdefault("adapter_s", export(laptrain, run, adapter_dir, "--format", "mlx"))
    state.setdefault("fused_s", export(laptrain, run, fused_dir, "--format", "mlx", "--fuse"))
    with no_transformers_bars():
        model = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=torch.float32)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(merged_dir))
    fused, mlx_tokenizer = load(str(fused_dir))
    rope = rope_keys(json.loads((Path(base) / "config.json").read_text()))
    with_adapter, _ = load(base, adapter_path=str(adapter_dir), model_config=rope)
    texts, _ = held_out_texts(tokenizer, args.texts)
    for index in range(len(state["texts"]), len(texts)):
        if args.max_seconds and time.perf_counter() - start > args.max_seconds:
            state_file.write_text(json.dumps(state))
            print(f"scored {index} of {len(texts)} texts: rerun the same command to go on")
            return
        ids = tokenizer(texts[index], add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            theirs = model(torch.tensor([ids])).logits[0].float().numpy()
        ours = logits_of(fused, ids)
        adapter_gap = None
        if index < args.adapter_texts:
            adapter_gap = float(np.abs(logits_of(with_adapter, ids) - ours).max())
        state["texts"].append(
            {
                "positions": len(ids),
                "top1": int((ours.argmax(-1) == theirs.argmax(-1)).sum()),
                "fused_gap": float(np.abs(ours - theirs).max()),
                "adapter_gap": adapter_gap,
            }
        )
        state_file.write_text(json.dumps(state))
    replies = []
    for question in PROMPTS:
        messages = [{"role": "user", "content": question}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        mlx_ids = list(mlx_tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False,
                                 eos_token_id=end_of_turn_ids(tokenizer),
                                 pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        hf = tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True).strip()
        mlx = generate(fused, mlx_tokenizer, prompt=mlx_ids, max_tokens=48).strip()
        replies.append((question, mlx_ids == ids, mlx, hf))

    scored = state["texts"]
    positions = sum(t["positions"] for t in scored)
    top1 = sum(t["top1"] for t in scored) / positions
    fused_gap = max(t["fused_gap"] for t in scored)
    adapter_gaps = [t["adapter_gap"] for t in scored if t["adapter_gap"] is not None]
    print(f"\n{machine_line()}")
    print(f"run: {run}; base {base}; {len(scored)} held-out texts\n")
    print(
        "| adapter export s | fused export s | positions | top-1 equal (fused vs transformers) "
        "| max abs dlogit fused vs transformers | max abs dlogit adapter vs fused "
        f"({len(adapter_gaps)} texts) | same replies |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    same = sum(mlx == hf for _, _, mlx, hf in replies)
    print(
        f"| {state['adapter_s']:.1f} | {state['fused_s']:.1f} | {positions} | {top1:.2%} "
        f"| {fused_gap:.2e} | {max(adapter_gaps):.2e} | {same}/{len(replies)} |"
    )
    print("\n| prompt | same prompt ids | mlx-lm (fused, greedy) | transformers (greedy) |")
    print("|---|---|---|---|")
    for question, same_ids, mlx, hf in replies:
        mlx, hf = (t.replace("|", "\\|").replace("\n", " ") for t in (mlx, hf))
        print(f"| {question} | {same_ids} | {mlx} | {hf} |")


if __name__ == "__main__":
    main()
