"""Padding waste and training speed: random batches vs batches grouped by length.

Runs on the offline default corpus (stdlib docstrings) with the default tiny classifier, both ways
side by side in one process, interleaved (A, B, A, B, ...) so machine noise hits both alike, and
prints a markdown table of ratios.

    python benchmarks/padding.py [--steps 60] [--rounds 3] [--batch-size 16] [--max-length 128]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml

from laptrain.families.classifier.stdlib_docstrings import build_stdlib_docstrings
from laptrain.families.classifier.text_classification import TextClassificationDataModule
from laptrain.families.classifier.text_classifier import TextClassifierModule

ROOT = Path(__file__).resolve().parents[1]


def datamodule(
    grouped: bool, batch_size: int, max_length: int, cache: str
) -> TextClassificationDataModule:
    conf = yaml.safe_load((ROOT / "conf/data/stdlib_docstrings.yaml").read_text())
    files = build_stdlib_docstrings(cache, conf["builder"]["families"])
    dm = TextClassificationDataModule(
        files=files,
        group_column="module",
        max_length=max_length,
        batch_size=batch_size,
        group_by_length=grouped,
        cache_dir=cache,
    )
    dm.setup()
    return dm


def seconds_per_step(
    model: TextClassifierModule, batches: list[dict], optimizer: torch.optim.Optimizer
) -> float:
    start = time.perf_counter()
    for batch in batches:
        loss = model.model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) / len(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=128)
    args = parser.parse_args()
    torch.manual_seed(0)
    cache = str(Path(tempfile.gettempdir()) / "laptrain-bench")
    dms = {
        name: datamodule(name == "grouped", args.batch_size, args.max_length, cache)
        for name in ("random", "grouped")
    }
    conf = yaml.safe_load((ROOT / "conf/model/tiny_classifier.yaml").read_text())
    kwargs = dms["random"].model_kwargs()
    model = TextClassifierModule(backbone=conf["backbone"], **kwargs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens, batches = {}, {}
    for name, dm in dms.items():
        tokens[name] = dm.token_count("train")
        loader = iter(dm.train_dataloader())
        batches[name] = [next(loader) for _ in range(args.steps)]
    seconds_per_step(model, batches["random"][:5], optimizer)  # warm-up
    times: dict[str, list[float]] = {"random": [], "grouped": []}
    for _ in range(args.rounds):
        for name in ("random", "grouped"):
            times[name].append(seconds_per_step(model, batches[name], optimizer))
    step = {name: statistics.median(t) for name, t in times.items()}
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch_size}, "
        f"max_length {args.max_length}, {args.steps} steps x {args.rounds} rounds, interleaved\n"
    )
    print("| batching | real tokens | padded tokens | padding share | median s/step | speed-up |")
    print("|---|---|---|---|---|---|")
    for name in ("random", "grouped"):
        real, padded = tokens[name]
        print(
            f"| {name} | {real} | {padded} | {1 - real / padded:.0%} | {step[name]:.4f} | "
            f"{step['random'] / step[name]:.2f}x |"
        )


if __name__ == "__main__":
    main()
