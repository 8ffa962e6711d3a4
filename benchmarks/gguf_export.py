"""A LoRA run exported as GGUF and read by llama.cpp itself: agreement with the merged model.

    pip install -e '.[llamacpp]'           # builds llama.cpp from source (cmake, a C++ compiler)
    python benchmarks/gguf_export.py --run outputs/<a lora_smollm2 run>
    python benchmarks/gguf_export.py       # trains `experiment=lora_smollm2` first (~4 min, 2 cores)
    python benchmarks/gguf_export.py --run R --quants f16,q8_0 --texts 40

For each quantisation, ``laptrain export <run> --format gguf --quant Q`` writes the file (timed),
llama-cpp-python loads it, and every held-out text (the chat rendering of "What does `x.f` do?" ->
its docstring's first sentence, for standard-library modules the preset never trains on) is scored
at every position by llama.cpp and by the merged transformers model in float32, on the same token
ids (laptrain.families.lora.gguf.llama_cpp_check). The first table gives, per file: its size, the export
time, whether llama.cpp tokenizes the texts exactly as transformers does, the top-1 next-token
agreement, the largest and mean absolute difference of log-probabilities, and each model's
perplexity, with the ratio to the f16 file's. The second puts three greedy replies side by side
(llama.cpp formats the chat with the template stored in the file).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def train(folder: Path) -> Path:
    command = [sys.executable, str(ROOT / "train.py"), "experiment=lora_smollm2", "run_name=gguf"]
    subprocess.run(command, cwd=folder, check=True)
    return folder / "outputs" / "gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None, help="a finished LoRA run folder")
    parser.add_argument("--quants", default="f16,q8_0,q4_0")
    parser.add_argument("--texts", type=int, default=300, help="held-out texts scored")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()

    import torch
    from arms import machine_line
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from laptrain.commands.cli import main as laptrain
    from laptrain.console import no_transformers_bars, quiet_libraries
    from laptrain.families.lora.gguf.llama_cpp_check import (
        QUESTIONS,
        compare,
        greedy_replies,
        held_out_texts,
        load_llama_cpp,
    )

    quiet_libraries()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="laptrain-gguf-") as tmp:
        run = args.run or train(Path(tmp))
        merged_dir = Path(tmp) / "merged"
        assert laptrain(["export", str(run), "--out", str(merged_dir)]) == 0
        with no_transformers_bars():
            model = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=torch.float32)
        model.eval()
        tokenizer = AutoTokenizer.from_pretrained(str(merged_dir))
        texts, starts = held_out_texts(tokenizer, args.texts)
        rows, replies, f16 = [], {}, None
        for quant in args.quants.split(","):
            out = Path(tmp) / f"gguf-{quant}"
            start = time.perf_counter()
            assert laptrain(["export", str(run), "--format", "gguf", "--quant", quant,
                             "--out", str(out)]) == 0  # fmt: skip
            seconds = time.perf_counter() - start
            size = (out / "model.gguf").stat().st_size / 1024**2
            llm = load_llama_cpp(out / "model.gguf", threads=args.threads)
            found = compare(llm, model, tokenizer, texts, starts)
            replies[quant] = [greedy_replies(llm, model, tokenizer, q) for q in QUESTIONS]
            llm.close()
            f16 = f16 or (found if quant == "f16" else None)
            rows.append((quant, size, seconds, found))

    print(f"\n{machine_line()}")
    print(f"run: {run}; {len(texts)} held-out texts, {rows[0][3].positions} positions\n")
    print(
        "| file | MiB | export s | same tokens | top-1 equal | max abs dlogp | mean abs dlogp "
        "| ppl llama.cpp (transformers) | / f16 | answer ppl llama.cpp (transformers) | / f16 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for quant, size, seconds, f in rows:
        ratio = f"{f.ppl_llama_cpp / f16.ppl_llama_cpp:.4f}" if f16 else "n/a"
        answer = f"{f.answer_ppl_llama_cpp / f16.answer_ppl_llama_cpp:.4f}" if f16 else "n/a"
        print(
            f"| {quant} | {size:.1f} | {seconds:.1f} | {f.same_tokens:.0%} | {f.top1:.2%} "
            f"| {f.max_abs_logprob:.4f} | {f.mean_abs_logprob:.5f} | {f.ppl_llama_cpp:.3f} "
            f"({f.ppl_transformers:.3f}) | {ratio} | {f.answer_ppl_llama_cpp:.3f} "
            f"({f.answer_ppl_transformers:.3f}) | {answer} |"
        )
    print("\n| question | file | llama.cpp (greedy) | transformers (greedy) |")
    print("|---|---|---|---|")
    for i, question in enumerate(QUESTIONS):
        for quant, pairs in replies.items():
            cpp, hf = (text.replace("|", "\\|").replace("\n", " ") for text in pairs[i])
            print(f"| {question} | {quant} | {cpp} | {hf} |")


if __name__ == "__main__":
    main()
