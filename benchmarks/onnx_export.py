"""Classifier runs exported as ONNX: agreement with torch, int8 accuracy, predict startup and speed.

    pip install -e '.[onnx]'
    python benchmarks/onnx_export.py                    # trains the default job and a short MiniLM run
    python benchmarks/onnx_export.py --run outputs/A --run outputs/B --repeats 3

For each classifier run, ``laptrain export RUN --format onnx`` (and ``--quant int8``) writes the
folders; on the run's test split (as its datamodule splits it) the torch model (the run's
``model/``, what ``laptrain predict RUN`` loads) and onnxruntime give logits for the same token ids:
top-1 agreement and max |Δ logit| in float32, and the accuracy of torch, ONNX float32 and ONNX
int8 against the labels. Then ``laptrain predict`` as a user runs it, torch (RUN) and ONNX (its
folder) interleaved, each ``--repeats`` times, median: startup is the process wall time to the
first prediction (one text), texts/s the test split's texts over the extra time ``--file`` takes.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = {"default": [], "minilm": ["experiment=minilm", "trainer.max_steps=60"]}


def train(folder: Path, name: str) -> Path:
    command = [sys.executable, str(ROOT / "train.py"), *JOBS[name], f"run_name={name}"]
    subprocess.run(command + ["logger=none"], cwd=folder, check=True)
    return folder / "outputs" / name


def test_split(run: Path) -> tuple[list[str], list[str]]:
    """The texts of the run's test split and their label names, as its datamodule split them."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from laptrain.run_folder.naming import register_resolvers

    register_resolvers()
    datamodule = instantiate(OmegaConf.load(run / ".hydra" / "config.yaml").data, batch_size=16)
    splits = datamodule.read_splits(datamodule._resolve_files())
    return splits.texts["test"], [splits.label_names[i] for i in splits.labels["test"]]


def logits(run: Path, onnx: Path, texts: list[str]) -> tuple:
    """Torch's and onnxruntime's logits of ``texts``, in batches of 32, on the same ids."""
    import numpy as np
    import onnxruntime
    import torch

    from laptrain.families.classifier.predict import Classifier

    classifier = Classifier(run)
    session = onnxruntime.InferenceSession(str(onnx / "model.onnx"))
    names = [i.name for i in session.get_inputs()]
    expected, got = [], []
    for start in range(0, len(texts), 32):
        batch = classifier.tokenizer(
            texts[start : start + 32],
            padding=True,
            truncation=True,
            max_length=classifier.max_length,
            return_tensors="pt",
        )
        with torch.inference_mode():
            expected.append(classifier.model(**batch).logits.numpy())
        got.append(session.run(None, {n: batch[n].numpy() for n in names})[0])
    return np.concatenate(expected), np.concatenate(got), classifier.labels


def predict_seconds(target: Path, *args: str) -> float:
    start = time.perf_counter()
    command = [sys.executable, "-m", "laptrain.commands.cli", "predict", str(target), *args]
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


def measure(run: Path, repeats: int, folder: Path) -> list[str]:
    import numpy as np

    from laptrain.commands.cli import main as laptrain
    from laptrain.families.classifier.onnx_predict import OnnxClassifier

    for quant in ([], ["--quant", "int8"]):
        start = time.perf_counter()
        assert laptrain(["export", str(run), "--format", "onnx", "--force", *quant]) == 0
        print(f"export {' '.join(quant) or 'float32'}: {time.perf_counter() - start:.1f} s")
    texts, gold = test_split(run)
    expected, got, labels = logits(run, run / "onnx", texts)
    accuracy = {
        "torch": np.mean([labels[i] == g for i, g in zip(expected.argmax(-1), gold)]),
        "onnx": np.mean([labels[i] == g for i, g in zip(got.argmax(-1), gold)]),
        "int8": np.mean(
            [p.label == g for p, g in zip(OnnxClassifier(run / "onnx-int8").predict(texts), gold)]
        ),
    }
    rows = folder / f"{run.name}-test.csv"
    with rows.open("w", newline="") as f:
        csv.writer(f).writerows([["text"], *[[t] for t in texts]])
    startup: dict[str, list[float]] = {"torch": [], "onnx": []}
    speed: dict[str, list[float]] = {"torch": [], "onnx": []}
    for _ in range(repeats):  # interleaved: a slower minute hits both
        for name, target in (("torch", run), ("onnx", run / "onnx")):
            one = predict_seconds(target, texts[0])
            every = predict_seconds(target, "--file", str(rows), "--out", str(folder / "o.csv"))
            startup[name].append(one)
            speed[name].append((len(texts) - 1) / max(every - one, 1e-3))
    med = {k: statistics.median(v) for k, v in startup.items()}
    tps = {k: statistics.median(v) for k, v in speed.items()}
    return [
        f"| {run.name} | {len(texts)} | {(got.argmax(-1) == expected.argmax(-1)).mean():.4f} | "
        f"{np.abs(got - expected).max():.1e} | {accuracy['torch']:.4f} | {accuracy['onnx']:.4f} | "
        f"{accuracy['int8']:.4f} | {med['torch']:.2f} / {med['onnx']:.2f} | "
        f"{tps['torch']:.0f} / {tps['onnx']:.0f} |"
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, action="append", help="a finished classifier run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from arms import machine_line

    from laptrain.console import quiet_libraries

    quiet_libraries()
    with tempfile.TemporaryDirectory() as tmp:
        runs = args.run or [train(Path(tmp), name) for name in JOBS]
        lines = [line for run in runs for line in measure(run, args.repeats, Path(tmp))]
    print(f"\n{machine_line()}; `python {' '.join(sys.argv)}`\n")
    print(
        "| run | test texts | top-1 agreement | max \\|Δ logit\\| fp32 | accuracy torch | "
        "accuracy ONNX fp32 | accuracy ONNX int8 | predict startup s, torch / ONNX | "
        "texts/s, torch / ONNX |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
