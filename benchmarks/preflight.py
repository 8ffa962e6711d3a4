"""Estimate vs measured peak memory for the preflight (laptrain.preflight.batch).

    python benchmarks/preflight.py            # markdown table; about 3 minutes on 2 CPU cores

For a BERT classifier (BertConfig) and a small causal LM (LlamaConfig), at three micro batches x two
sequence lengths x gradient checkpointing off/on, each case runs in a fresh process (so the peak is
its own): build the model, estimate with the preflight, run two real AdamW steps, read the peak
(process RSS high-water mark on CPU; ``torch.cuda.max_memory_allocated`` with ``--device cuda``).
The table shows estimate / measured; the goal on CPU is 0.85-1.15 everywhere.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time

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
GB = 1024**3


def build(name: str):
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
    from laptrain.preflight.activations import hf_batch_maker, hf_loss
    from laptrain.preflight.batch import measure_peak
    from laptrain.preflight.estimate import model_memory

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = build(name)
    if checkpointing:
        model.gradient_checkpointing_enable()
    probe = TorchProbe(device)
    rss = probe.memory().rss
    memory = model_memory(model, seq_len, "32-true")
    baseline = rss - memory.materialized_cpu_bytes if device == "cpu" else 0.0
    estimate = memory.estimate(batch, seq_len, device, baseline)
    make = hf_batch_maker(model)
    peak = measure_peak(model, batch, seq_len, probe, "32-true", make, hf_loss)
    parts = {
        k: getattr(estimate, k)
        for k in ("weights", "grads", "optimizer", "activations", "transient", "overhead")
    }
    return {"estimate": estimate.total, "measured": peak, "parts": parts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"))
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
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
                    ratios.append(f"{ratio:.2f} ({result['measured'] / GB:.2f} GB)")
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
