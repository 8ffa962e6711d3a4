"""Shared fixtures: Hydra composition of conf/train.yaml, a small CSV data set, subprocess runs."""

# ruff: noqa: E402  (OMP_WAIT_POLICY is set before the imports that load torch)

from __future__ import annotations

import os

# Two workers on 2 cores, each with torch's threads: OpenMP threads that spin while they wait for
# work (its default active wait) burn the cores the other worker needs. Waiting passively took a
# quarter of the suite's wall time and half its CPU time away (2026-11-29, CONTRIBUTING.md); set
# before torch is imported, so libgomp reads it, and inherited by every process a test starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import csv
import gc
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _pytest.nodeid import NodeId
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from laptrain.families.classifier.tiny_bert import tiny_bert_backbone
from laptrain.run_folder.naming import register_resolvers

if TYPE_CHECKING:
    import lightning.pytorch as pl

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
CONF_FIXTURES = ROOT / "tests" / "conf"  # test-only config options (callbacks=fake_mps)
TRAIN = ROOT / "train.py"
# benchmarks/smoke_harness, found as `python benchmarks/device_smoke.py` finds it
sys.path.append(str(ROOT / "benchmarks"))
register_resolvers()

# A tiny BERT for in-process tests (laptrain.families.classifier.tiny_bert), and the same as train.py overrides for
# end-to-end runs.
TINY_BERT = tiny_bert_backbone()
# The tiny offline LoRA job: a 1-layer Llama pretrained for 4 steps, adapters of rank 4 (seconds on
# 2 cores); each test adds its data modules, lengths and batch.
TINY_LORA = [
    "experiment=lora_offline",
    "hardware=cpu",
    "hardware.torch_threads=1",
    "model.tiny_base.hidden_size=32",
    "model.tiny_base.intermediate_size=64",
    "model.tiny_base.num_layers=1",
    "model.tiny_base.steps=4",
    "model.lora.r=4",
]
TINY = [
    "model.backbone.hidden_size=32",
    "model.backbone.intermediate_size=64",
    "model.backbone.num_hidden_layers=1",
    "data.vocab_size=300",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The suite runs on two pytest-xdist workers (``-n 2 --dist loadgroup`` in pyproject.toml).
    A test that uses a module-scoped fixture (a trained run, a built model) is grouped with its
    module's other tests on one worker, so the fixture is built once, not once per worker.

    loadgroup schedules by a ``@group`` suffix of the node id, which pytest-xdist 3.8 writes to
    ``item._nodeid``; pytest 9 reads the id from ``item._id``, so the suffix is written here."""
    grouping = getattr(config.option, "loadgroup", False)  # set in xdist's workers
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(d.scope in ("module", "class") for found in defs for d in found):
            group = item.module.__name__
            item.add_marker(pytest.mark.xdist_group(group))
            if grouping and "@" not in item.nodeid and hasattr(item, "_id"):
                item._id = NodeId.parse(f"{item.nodeid}@{group}")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what the imports built (torch, Lightning, transformers: ~460,000 objects) out of the
    garbage collector's reach: a full ``gc.collect()``, which laptrain calls before each memory
    measurement and OOM retry, then walks only what the tests build (0.23 s -> ~0 s a call)."""
    gc.collect()
    gc.freeze()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The same for what a test module imported as it ran, once per module; garbage is collected
    first, so nothing collectable is frozen."""
    module = getattr(item, "module", None)
    if module is not None and module is not _frozen.get("module"):
        _frozen["module"] = module
        gc.collect()
        gc.freeze()


_frozen: dict[str, Any] = {}


# The tiny classifier without dropout: runs that must end equal (1 vs 2 processes, an OOM retry).
NO_DROPOUT = [
    "model.backbone.hidden_dropout_prob=0",
    "model.backbone.attention_probs_dropout_prob=0",
]


def tiny_classifier_job(tmp_path: Path) -> list[str]:
    """``train.py`` arguments for the tiny classifier on CPU, trained on 240 labelled texts written
    into ``tmp_path`` (192 train rows: 12 batches of 16 an epoch)."""
    return [
        "hardware=cpu",
        "model=tiny_classifier",
        "data=text_csv",
        *TINY,
        f"data.files.train={write_texts(tmp_path / 'texts.csv')}",
    ]


def compose_train(overrides: list[str], tmp_path: Path | None = None) -> DictConfig:
    """Compose conf/train.yaml like `python train.py <overrides>` would, without running it."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    HydraConfig().set_config(cfg)
    if tmp_path is not None:
        with open_dict(cfg):
            cfg.paths.output_dir = str(tmp_path / "run")
            cfg.paths.cache_dir = str(tmp_path / "cache")
    return cfg


@pytest.fixture(autouse=True)
def _clear_hydra():
    yield
    GlobalHydra.instance().clear()


@pytest.fixture(autouse=True)
def _forget_user_packages():
    """A test's own modules (a ``user`` package, a ``mytask.py``: a project of its own in
    tmp_path) leave this process with it: the next test on this worker imports its own from
    another folder. A module is the test's when its file lies in the temporary folder, outside
    this repository (a clone may itself sit in /tmp)."""
    yield
    tmp, repo = tempfile.gettempdir(), str(ROOT)
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None) or ""
        if (
            name == "user"
            or name.startswith("user.")
            or (where.startswith(tmp) and not where.startswith(repo))
        ):
            del sys.modules[name]


WORDS = {
    "sports": "match goal team score player coach league season win ball",
    "cooking": "oven recipe salt butter flour bake simmer garlic pan dough",
    "weather": "rain cloud storm wind forecast sunny snow cold humid front",
}


def write_texts(path: Path, rows: int = 240, seed: int = 0, fmt: str = "csv") -> Path:
    """Labelled texts of varying length (3-40 words) whose words give the label away."""
    rng = random.Random(seed)
    records = []
    for i in range(rows):
        label = list(WORDS)[i % len(WORDS)]
        words = WORDS[label].split() + ["the", "a", "of", "and", "to", "in", "is", "it"]
        records.append(
            {"text": " ".join(rng.choice(words) for _ in range(rng.randint(3, 40))), "label": label}
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "csv":
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["text", "label"])
            writer.writeheader()
            writer.writerows(records)
    elif fmt == "jsonl":
        import json

        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif fmt == "parquet":
        import pandas as pd

        pd.DataFrame(records).to_parquet(path)
    return path


@pytest.fixture
def texts_csv(tmp_path: Path) -> Path:
    return write_texts(tmp_path / "texts.csv")


def run_train(
    args: list[str],
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: int = 240,
    fresh: bool = False,
) -> subprocess.CompletedProcess:
    """`python train.py <args>` as a process of its own (signals, exit codes, several processes):
    forked from a server that has imported torch and Lightning (tests/forked_train.py), or a fresh
    interpreter with ``fresh`` or an ``env`` that changes what one reads at start."""
    from tests.forked_train import run_python

    full_env = {**os.environ, "LAPTRAIN_CACHE": str(cwd / "cache"), **(env or {})}
    # a profile's env reaches torch only before its import: hardware.env.* needs a fresh start
    fresh = fresh or any("hardware.env" in a for a in args)
    return run_python([str(TRAIN), *args], cwd, full_env, timeout, fresh)


def quiet_trainer(last_ckpt: str | Path | None = None, **overrides: Any) -> pl.Trainer:
    """A Trainer that prints and writes nothing of its own: no progress bar, model summary, logger
    or checkpoints. Each test passes what it exercises (``enable_checkpointing=True``, a logger);
    ``last_ckpt``: where its stops and saves write ``last.ckpt``, as the job's ``paths.last_ckpt``."""
    import lightning.pytorch as pl

    from laptrain.checkpoints.stop import use_last_checkpoint

    quiet = {
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
    }
    trainer = pl.Trainer(**{**quiet, **overrides})
    use_last_checkpoint(trainer, last_ckpt)
    return trainer
