"""Estimate vs measured peak memory for the preflight (laptrain.preflight.batch).

    python benchmarks/preflight.py            # markdown table; about 3 minutes on 2 CPU cores

For a BERT classifier (BertConfig) and a small causal LM (LlamaConfig), at three micro batches x two
sequence lengths x gradient checkpointing off/on, each case runs in a fresh process (so the peak is
its own): build the model, estimate with the preflight, run two real AdamW steps, read the peak
(process RSS high-water mark on CPU; ``torch.cuda.max_memory_allocated`` with ``--device cuda``).
The table shows estimate / measured; the goal on CPU is 0.85-1.15 everywhere.

    python benchmarks/preflight.py --real     # the real pretrained presets; about 5 min, 2 cores

``--real``: the jobs users run, each as ``python train.py`` in a fresh process (3 optimizer steps,
no validation or test): SmolLM2-135M LoRA (``experiment=lora_smollm2``, batch 16) and
all-MiniLM-L6-v2 (``experiment=minilm``, batch 16) under ``data.max_length=256``, each on examples
far shorter than that (40 words: the preflight sizes by the longest) and on examples cut at 256
tokens, gradient checkpointing off and on. Every row of a set has the same length, so the first
steps already run the widest batch (with long-tailed data the widest batch may come late). The
estimate is the one the run prints (``preflight: estimate ...``); the measured peak is the whole
process's RSS high-water mark (``os.wait4``), so whatever the run holds besides the training step
(data, tokenizer, Lightning, TensorBoard) counts against the estimate too. The models must be
cached (``laptrain fetch model=smollm2_135m_lora``, ``laptrain fetch model=minilm_classifier``).
The cpu profile's ``hardware.malloc_keep_freed`` applies as in any run (the table's header says
which); ``--set`` adds overrides to every case, ``--only`` keeps the cases whose model or data
contains a word:

    python benchmarks/preflight.py --real --only SmolLM2 --set hardware.malloc_keep_freed=false

``--grpo``: ``laptrain preflight``'s estimate from the config alone (the rollout counted,
families/lora/grpo_sizing.py) against the peak RSS of the same job's ``python train.py`` (3 steps,
as ``--real``), for ``experiment=grpo_offline`` and ``experiment=grpo_smollm2`` on the bundled
prompts. ``data.max_length`` is set to the set's longest prompt + ``model.max_new_tokens`` (what
train.py's preflight prints as the longest example), so the config's worst case is the run's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = {
    "bert": dict(
        vocab_size=8000,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=512,
    ),
    "llama": dict(
        vocab_size=8000,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=768,
        max_position_embeddings=1024,
    ),
}
BATCHES = (4, 8, 16)
LENGTHS = (128, 256)
GiB = 1024**3


def build(name: str):
    if name == "dpo":  # LoRA r 8 on the llama case's base, trained with the DPO loss
        from laptrain.families.lora.dpo import DPOLoRAModule

        backbone = {"model_type": "llama", **MODELS["llama"]}
        return DPOLoRAModule(backbone=backbone, lora={"r": 8})
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        LlamaConfig,
        LlamaForCausalLM,
    )

    if name == "bert":
        return BertForSequenceClassification(BertConfig(**MODELS[name]))
    return LlamaForCausalLM(LlamaConfig(**MODELS[name]))


def run_case(name: str, batch: int, seq_len: int, checkpointing: bool, device: str) -> dict:
    """One case, in this process: estimate, then two real steps; returns both in bytes."""
    import torch

    from laptrain.hardware.probe import TorchProbe
    from laptrain.model.gradient_checkpointing import switch_on
    from laptrain.preflight.activations import hf_batch_maker, hf_loss
    from laptrain.preflight.batch import measure_peak
    from laptrain.preflight.estimate import model_memory

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = build(name)
    if checkpointing:
        switch_on(model)
    probe = TorchProbe(device)
    rss = probe.memory().rss
    make, loss_fn = hf_batch_maker(model), hf_loss
    if name == "dpo":  # the module sizes its own step (laptrain.model.contracts.SizesItsStep)
        make, loss_fn = model.preflight_batch, lambda m, b: m.preflight_loss(b)
    memory = model_memory(model, seq_len, "32-true", make, loss_fn)
    baseline = rss - memory.materialized_cpu_bytes if device == "cpu" else 0.0
    estimate = memory.estimate(batch, seq_len, device, baseline)
    peak = measure_peak(model, batch, seq_len, probe, "32-true", make, loss_fn)
    parts = {
        k: getattr(estimate, k)
        for k in ("weights", "grads", "optimizer", "activations", "transient", "overhead")
    }
    return {"estimate": estimate.total, "measured": peak, "parts": parts}


ROOT = Path(__file__).resolve().parents[1]
WORDS = [
    "the",
    "of",
    "a",
    "to",
    "in",
    "is",
    "it",
    "that",
    "for",
    "on",
    "with",
    "as",
    "by",
    "be",
    "this",
    "are",
    "from",
    "or",
    "at",
    "an",
]


def write_rows(folder: Path, words: int) -> tuple[Path, Path, Path]:
    """Instruction pairs, preference pairs and labelled texts whose prompts/texts all have
    ``words`` words, so that every batch is as wide as the widest (the one the preflight sizes by)
    within the first steps."""
    import random

    rng = random.Random(words)
    pairs, texts = folder / f"pairs_{words}.jsonl", folder / f"texts_{words}.csv"
    preferences = folder / f"preferences_{words}.jsonl"
    with pairs.open("w") as out, preferences.open("w") as prefs:
        for _ in range(200):
            prompt = " ".join(rng.choice(WORDS) for _ in range(words))
            response = " ".join(rng.choice(WORDS) for _ in range(12))
            rejected = " ".join(rng.choice(WORDS) for _ in range(12))
            out.write(json.dumps({"prompt": prompt, "response": response}) + "\n")
            row = {"prompt": prompt, "chosen": response, "rejected": rejected + " no"}
            prefs.write(json.dumps(row) + "\n")
    with texts.open("w") as out:
        out.write("text,label\n")
        for i in range(400):
            out.write(" ".join(rng.choice(WORDS) for _ in range(words)) + f",{'ab'[i % 2]}\n")
    return pairs, preferences, texts


def real_cases(folder: Path) -> list[tuple[str, str, list[str]]]:
    """(model, data description, train.py overrides) of every --real case: short examples (40
    words, under data.max_length=256) and examples cut at 256 tokens, every row the same length."""
    short_pairs, short_prefs, short_texts = write_rows(folder, 40)
    long_pairs, long_prefs, long_texts = write_rows(folder, 700)
    lora = ["experiment=lora_smollm2", "data=instructions", "data.max_length=256"]
    dpo = ["experiment=dpo_smollm2", "data=preferences", "data.max_length=256"]
    minilm = ["experiment=minilm", "data=text_csv", "data.max_length=256"]
    cases = []
    for ckpt in ("false", "true"):
        on = f"model.gradient_checkpointing={ckpt}"
        cases += [
            ("SmolLM2 LoRA", "40-word prompts", [*lora, f"data.files.train={short_pairs}", on]),
            ("SmolLM2 LoRA", "cut at 256", [*lora, f"data.files.train={long_pairs}", on]),
            ("SmolLM2 DPO", "40-word prompts", [*dpo, f"data.files.train={short_prefs}", on]),
            ("SmolLM2 DPO", "cut at 256", [*dpo, f"data.files.train={long_prefs}", on]),
            ("MiniLM", "40-word texts", [*minilm, f"data.files.train={short_texts}", on]),
            ("MiniLM", "cut at 256", [*minilm, f"data.files.train={long_texts}", on]),
        ]
    return cases


ESTIMATE = re.compile(r"preflight: estimate ([0-9.]+) GiB at micro batch (\d+) x (\d+) tokens")


def chosen(cases: list[tuple[str, str, list[str]]], only: str | None) -> list:
    """The --real cases whose model or data names contain ``only`` (all of them without it)."""
    word = (only or "").lower()
    return [c for c in cases if word in c[0].lower() or word in c[1].lower()]


def run_real(overrides: list[str], folder: Path) -> dict:
    """One train.py run of 3 steps in a fresh process: its printed estimate and its peak RSS."""
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        *overrides,
        "hardware=cpu",
        "trainer.max_steps=3",
        "trainer.max_epochs=-1",
        "++trainer.limit_val_batches=0",
        "++trainer.num_sanity_val_steps=0",
        "test=false",
        f"hydra.run.dir={folder}",
    ]
    with tempfile.TemporaryFile("w+") as out:
        child = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        out.seek(0)
        text = out.read()
    found = ESTIMATE.search(text)
    if os.waitstatus_to_exitcode(status) or not found:
        raise SystemExit(f"train.py {' '.join(overrides)} failed:\n{text[-3000:]}")
    return {
        "estimate": float(found.group(1)) * GiB,
        "batch": int(found.group(2)),
        "tokens": int(found.group(3)),
        "measured": usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024),
    }


def real(args: argparse.Namespace) -> None:
    import torch

    start = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (model, data, overrides) in enumerate(chosen(real_cases(Path(tmp)), args.only)):
            result = run_real([*overrides, *args.set], Path(tmp) / f"run{i}")
            ckpt = "on" if "model.gradient_checkpointing=true" in overrides else "off"
            ratio = result["estimate"] / result["measured"]
            rows.append((model, data, ckpt, result, ratio))
            print(model, data, ckpt, json.dumps(result), file=sys.stderr)
    print(
        f"estimate ÷ measured peak RSS of `python train.py` (3 steps, hardware=cpu), "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}, {time.time() - start:.0f} s; hardware.malloc_keep_freed "
        f"{keep_freed(args.set)}" + (f"; overrides {' '.join(args.set)}" if args.set else "") + "\n"
    )
    print(
        "| model | data | grad ckpt | sized at | estimate GiB | peak RSS GiB | ratio | 0.85-1.15 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for model, data, ckpt, r, ratio in rows:
        met = "yes" if 0.85 <= ratio <= 1.15 else "NO"
        print(
            f"| {model} | {data} | {ckpt} | {r['batch']} x {r['tokens']} | "
            f"{r['estimate'] / GiB:.2f} | {r['measured'] / GiB:.2f} | {ratio:.2f} | {met} |"
        )


# (name, overrides, longest prompt in tokens as train.py's preflight prints it, max_new_tokens)
GRPO_JOBS = (
    ("tiny Llama GRPO", ["experiment=grpo_offline"], 137, 8),
    ("SmolLM2 GRPO", ["experiment=grpo_smollm2"], 102, 16),
)


def config_estimate(overrides: list[str]) -> float:
    """``laptrain preflight --json``'s estimate in bytes, in a fresh process."""
    command = [sys.executable, "-m", "laptrain.commands.cli", "preflight", *overrides, "--json"]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["estimate_gib"] * GiB


def grpo(args: argparse.Namespace) -> None:
    import torch

    start = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, overrides, prompt, new) in enumerate(GRPO_JOBS):
            job = [*overrides, f"data.max_length={prompt + new}", "hardware=cpu", *args.set]
            estimate = config_estimate(job)
            result = run_real(job, Path(tmp) / f"grpo{i}")
            rows.append((name, prompt, new, estimate, result["measured"]))
            print(name, estimate, json.dumps(result), file=sys.stderr)
    print(
        f"`laptrain preflight` (config only) ÷ peak RSS of `python train.py` (3 steps, "
        f"hardware=cpu), {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, {time.time() - start:.0f} s\n"
    )
    print("| job | prompt + new tokens | estimate GiB | peak RSS GiB | ratio | 0.85-1.15 |")
    print("|---|---|---|---|---|---|")
    for name, prompt, new, estimate, measured in rows:
        ratio = estimate / measured
        met = "yes" if 0.85 <= ratio <= 1.15 else "NO"
        print(
            f"| {name} | {prompt} + {new} | {estimate / GiB:.2f} | {measured / GiB:.2f} | "
            f"{ratio:.2f} | {met} |"
        )


def keep_freed(overrides: list[str]) -> str:
    """The cpu profile's ``malloc_keep_freed`` as these overrides leave it (for the header)."""
    from omegaconf import OmegaConf

    value = OmegaConf.load(ROOT / "conf" / "hardware" / "cpu.yaml").get("malloc_keep_freed")
    for override in overrides:
        key, _, text = override.partition("=")
        if key.lstrip("+") == "hardware.malloc_keep_freed":
            value = text
    return str(value).lower()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"))
    parser.add_argument("--real", action="store_true", help="the real pretrained presets")
    parser.add_argument("--grpo", action="store_true", help="GRPO's config-only estimate")
    parser.add_argument("--only", help="--real: the cases whose model or data contains this word")
    parser.add_argument(
        "--set", action="append", default=[], help="--real: a train.py override for every case"
    )
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.real or args.grpo:
        (grpo if args.grpo else real)(args)
        return
    if args.case:
        name, batch, seq_len, ckpt = args.case.split(",")
        print(json.dumps(run_case(name, int(batch), int(seq_len), ckpt == "1", args.device)))
        return
    start = time.time()
    rows = []
    for name in MODELS:
        for seq_len in LENGTHS:
            for ckpt in (0, 1):
                ratios = []
                for batch in BATCHES:
                    case = f"{name},{batch},{seq_len},{ckpt}"
                    out = subprocess.run(
                        [sys.executable, __file__, "--device", args.device, "--case", case],
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    result = json.loads(out.stdout.strip().splitlines()[-1])
                    ratio = result["estimate"] / result["measured"]
                    ratios.append(f"{ratio:.2f} ({result['measured'] / GiB:.2f} GiB)")
                    print(case, json.dumps(result), file=sys.stderr)
                rows.append((name, seq_len, "on" if ckpt else "off", ratios))
    import torch

    print(
        f"estimate ÷ measured peak ({'process RSS' if args.device == 'cpu' else 'max allocated'}), "
        f"{platform.processor() or platform.machine()}, {platform.system()}, torch {torch.__version__}, "
        f"{time.time() - start:.0f} s\n"
    )
    print("| model | seq | grad ckpt | " + " | ".join(f"batch {b}" for b in BATCHES) + " |")
    print("|---|---|---|" + "---|" * len(BATCHES))
    for name, seq_len, ckpt, ratios in rows:
        print(f"| {name} | {seq_len} | {ckpt} | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main()
