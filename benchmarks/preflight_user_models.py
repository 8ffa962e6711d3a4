"""The measured preflight (laptrain.preflight.measured) against real training, on user modules.

    python benchmarks/preflight_user_models.py      # markdown table; about 2 minutes on 2 CPU cores

Three modules a user would write, each a plain LightningModule with a LightningDataModule in the
lightning-hydra-template style (``self.save_hyperparameters()``, loaders built with
``batch_size=self.hparams.batch_size``, ``DataLoader(shuffle=True)``), written into a temporary
project outside laptrain and found through ``hydra.searchpath`` and ``PYTHONPATH``: an MLP, a small
CNN and a plain ``nn.TransformerEncoder`` classifier, on random rows.

For each, two fresh ``python train.py`` processes, one after the other:

1. ``hardware.batch_size=auto`` with a budget of the process plus a headroom per model
   (``hardware.memory_fraction`` of the RAM available then): the measured preflight picks the
   batch; its predicted peak is the ``preflight: estimate ...`` line it prints.
2. that batch, fixed, with the preflight off: 20 optimizer steps (``--steps``), no validation or
   test; its measured peak is the whole process's RSS high-water mark (``os.wait4``), so whatever
   the run holds besides the step (data, Lightning, its callbacks and loggers) counts against the
   prediction.

The goal on CPU is predicted ÷ measured within 0.85-1.15. ``--only`` keeps the models whose name
contains a word; ``--set`` adds a train.py override to every run.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GiB = 1024**3

MODELS_PY = '''
import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(pl.LightningModule):
    """What the three share: cross entropy, accuracy logged, Adam."""

    def _step(self, batch, stage):
        x, y = batch
        logits = self(x)
        loss = nn.functional.cross_entropy(logits, y)
        self.log(f"{stage}/loss", loss)
        self.log(f"{stage}/acc", (logits.argmax(-1) == y).float().mean())
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class MLP(Classifier):
    """The lightning-hydra-template's SimpleDenseNet shape: Linear, BatchNorm, ReLU blocks."""

    def __init__(self, inputs: int = 3072, hidden: int = 1024, layers: int = 3, lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        sizes = [inputs] + [hidden] * layers
        blocks = [
            m
            for a, b in zip(sizes, sizes[1:])
            for m in (nn.Linear(a, b), nn.BatchNorm1d(b), nn.ReLU())
        ]
        self.net = nn.Sequential(*blocks, nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x.flatten(1))


class SmallCNN(Classifier):
    def __init__(self, width: int = 16, lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        w = width
        self.net = nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(),
            nn.Conv2d(w, 2 * w, 3, padding=1), nn.BatchNorm2d(2 * w), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * w, 4 * w, 3, padding=1), nn.BatchNorm2d(4 * w), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * w * 8 * 8, 10),
        )

    def forward(self, x):
        return self.net(x)


class TransformerClassifier(Classifier):
    def __init__(self, vocab: int = 1000, width: int = 128, heads: int = 4, layers: int = 4,
                 lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x)).mean(1))


class RandomRows(pl.LightningDataModule):
    """Random inputs of one shape (``kind``: images, or token ids) and labels 0-9."""

    def __init__(self, kind: str = "images", rows: int = 2048, seq_len: int = 128,
                 batch_size: int = 32, num_workers: int = 0):
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(0)
        rows = self.hparams.rows
        if self.hparams.kind == "tokens":
            x = torch.randint(0, 1000, (rows, self.hparams.seq_len), generator=g)
        else:
            x = torch.randn(rows, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (rows,), generator=g)
        cut = rows * 9 // 10
        self.train_set = TensorDataset(x[:cut], y[:cut])
        self.val_set = TensorDataset(x[cut:], y[cut:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True,
                          num_workers=self.hparams.num_workers)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size,
                          num_workers=self.hparams.num_workers)

    def test_dataloader(self):
        return self.val_dataloader()
'''

# name -> (model preset, data preset, headroom GiB): the budget is the process at the preflight
# plus this much (hardware.memory_fraction of the RAM available now), so that each search stops
# at the budget well below preflight.max_batch_size on any machine
CASES = {
    "MLP": (
        "_target_: bench_user_models.MLP\n",
        "_target_: bench_user_models.RandomRows\nkind: images\nrows: 4096\nbatch_size: 32\n",
        0.15,
    ),
    "small CNN": (
        "_target_: bench_user_models.SmallCNN\n",
        "_target_: bench_user_models.RandomRows\nkind: images\nrows: 2048\nbatch_size: 32\n",
        0.5,
    ),
    "TransformerEncoder": (
        "_target_: bench_user_models.TransformerClassifier\n",
        "_target_: bench_user_models.RandomRows\nkind: tokens\nrows: 1024\nbatch_size: 32\n",
        0.5,
    ),
}
ESTIMATE = re.compile(r"preflight: estimate ([0-9.]+) GiB at micro batch (\d+) \(")
BUDGET = re.compile(r"preflight: budget ([0-9.]+) GiB")
MEASURED = re.compile(r"preflight: measured: .*")


def write_project(folder: Path) -> None:
    """The user project: ``bench_user_models.py`` and a model and data preset per case."""
    (folder / "conf" / "model").mkdir(parents=True)
    (folder / "conf" / "data").mkdir(parents=True)
    (folder / "bench_user_models.py").write_text(MODELS_PY)
    for name, (model, data, _) in CASES.items():
        key = preset(name)
        (folder / "conf" / "model" / f"{key}.yaml").write_text(model)
        (folder / "conf" / "data" / f"{key}.yaml").write_text(data)


def preset(name: str) -> str:
    return "bench_" + re.sub(r"\W+", "_", name.lower())


def train(folder: Path, run: Path, overrides: list[str]) -> tuple[str, int]:
    """One ``python train.py`` of the user project in a fresh process: its output and the peak
    RSS (bytes) of that process alone (``os.wait4``)."""
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        f"hydra.searchpath=[file://{folder / 'conf'}]",
        f"hydra.run.dir={run}",
        "hardware=cpu",
        "data.batch_size=from_profile",
        "trainer.max_epochs=-1",
        "++trainer.limit_val_batches=0",
        "++trainer.num_sanity_val_steps=0",
        "test=false",
        *overrides,
    ]
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "LAPTRAIN_CACHE": str(folder / "cache")}
    with tempfile.TemporaryFile("w+") as out:
        child = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True
        )
        _, status, usage = os.wait4(child.pid, 0)
        out.seek(0)
        text = out.read()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"train.py {' '.join(overrides)} failed:\n{text[-3000:]}")
    return text, usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def run_case(name: str, folder: Path, extra: list[str], steps: int) -> dict:
    """The preflight's pick and prediction, then a real run at that batch."""
    import psutil

    key = preset(name)
    fraction = CASES[name][2] * GiB / psutil.virtual_memory().available
    common = [f"model={key}", f"data={key}", *extra]
    planned, _ = train(
        folder,
        folder / f"{key}-auto",
        [
            *common,
            "hardware.batch_size=auto",
            f"hardware.memory_fraction={fraction:.5f}",
            "preflight.max_batch_size=4096",
            "trainer.max_steps=1",
        ],
    )
    found, budget = ESTIMATE.search(planned), BUDGET.search(planned)
    if not found or not budget:
        raise SystemExit(f"{name}: no preflight estimate in the output:\n{planned[-3000:]}")
    batch = int(found.group(2))
    _, peak = train(
        folder,
        folder / f"{key}-fixed",
        [
            *common,
            f"hardware.batch_size={batch}",
            "preflight.enabled=false",
            f"trainer.max_steps={steps}",
        ],
    )
    trials = MEASURED.search(planned)
    return {
        "budget": float(budget.group(1)) * GiB,
        "batch": batch,
        "predicted": float(found.group(1)) * GiB,
        "measured": float(peak),
        "trials": trials.group(0) if trials else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="the models whose name contains this word")
    parser.add_argument("--set", action="append", default=[], help="a train.py override")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps of the real run")
    args = parser.parse_args()
    import torch

    start = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_project(folder)
        for name in CASES:
            if args.only and args.only.lower() not in name.lower():
                continue
            result = run_case(name, folder, args.set, args.steps)
            rows.append((name, result))
            print(name, result, file=sys.stderr)
    print(
        f"measured preflight: predicted ÷ measured peak RSS of `python train.py` at the batch it "
        f"picked ({args.steps} steps, hardware=cpu), {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}, {time.time() - start:.0f} s"
        + (f"; overrides {' '.join(args.set)}" if args.set else "")
        + "\n"
    )
    print(
        "| model | budget GiB | batch picked | predicted peak GiB | measured peak GiB | ratio "
        "| 0.85-1.15 |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, r in rows:
        ratio = r["predicted"] / r["measured"]
        met = "yes" if 0.85 <= ratio <= 1.15 else "NO"
        print(
            f"| {name} | {r['budget'] / GiB:.2f} | {r['batch']} | {r['predicted'] / GiB:.2f} | "
            f"{r['measured'] / GiB:.2f} | {ratio:.2f} | {met} |"
        )


if __name__ == "__main__":
    main()
