"""Sudoku-Extreme from the user's local copy of the official data (no download here).

Two layouts are read (docs/trm.md §4): the CSVs ``train.csv`` / ``test.csv`` with header
``source,question,answer,rating`` (81-character boards, ``.`` blank), or the official builder's
directory ``train|test/all__inputs.npy``, ``all__labels.npy`` and ``dataset.json`` (memory-mapped).
Tokens are the builder's (pad 0, blank 1, digit d -> d + 1), so files and checkpoints interoperate.
The official data has no validation split: validation uses ``val_size`` test puzzles drawn with
the seed (the official code evaluates on test too).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from laptrain.families.trm.sudoku import SudokuBoardsDataModule

_LUT = np.zeros(256, dtype=np.uint8)
_LUT[ord(".")] = _LUT[ord("0")] = 1
for _d in range(1, 10):
    _LUT[ord(str(_d))] = _d + 1
_MISSING = (
    "expected train.csv + test.csv (source,question,answer,rating) or train/ and test/ with "
    "all__inputs.npy, all__labels.npy, dataset.json (the official builder's output); get "
    "sapientinc/sudoku-extreme from the Hugging Face hub when online"
)


def _boards(strings: list[str], where: str) -> np.ndarray:
    if any(len(s) != 81 for s in strings):
        raise ValueError(f"{where}: every board must have 81 characters ('.' or 0 for blank)")
    tokens = _LUT[np.frombuffer("".join(strings).encode("ascii"), dtype=np.uint8)]
    if (tokens == 0).any():
        raise ValueError(f"{where}: boards may hold only 1-9 and '.' or 0")
    return tokens.reshape(-1, 81)


def read_csv(path: Path, min_rating: int | None) -> dict[str, np.ndarray]:
    """inputs/labels tokens [N, 81] and ratings from a ``source,question,answer,rating`` CSV."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = {"question", "answer", "rating"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(
                f"{path}: missing columns {sorted(missing)} (source,question,answer,rating)"
            )
        rows = [(r["question"], r["answer"], int(r["rating"])) for r in reader]
    if min_rating is not None:
        rows = [r for r in rows if r[2] >= min_rating]
    if not rows:
        raise ValueError(f"{path}: no puzzles left (lower data.min_rating)")
    questions, answers, ratings = zip(*rows, strict=True)
    return {
        "inputs": _boards(list(questions), str(path)),
        "labels": _boards(list(answers), str(path)),
        "rating": np.array(ratings, dtype=np.int32),
    }


def read_npy(split_dir: Path) -> dict[str, np.ndarray]:
    """Memory-mapped builder arrays; checks dataset.json's vocabulary and length."""
    meta = json.loads((split_dir / "dataset.json").read_text())
    if meta.get("seq_len") != 81 or meta.get("vocab_size") != 11:
        raise ValueError(
            f"{split_dir}/dataset.json: expected seq_len 81 and vocab_size 11 (Sudoku), got "
            f"{meta.get('seq_len')} and {meta.get('vocab_size')}"
        )
    return {
        "inputs": np.load(split_dir / "all__inputs.npy", mmap_mode="r"),
        "labels": np.load(split_dir / "all__labels.npy", mmap_mode="r"),
    }


class SudokuExtremeDataModule(SudokuBoardsDataModule):
    """Local Sudoku-Extreme (CSV or the official ``.npy`` layout), 9x9.

    Args:
        path: folder with ``train.csv``/``test.csv`` or ``train/``/``test/`` builder output.
        subsample: keep this many training puzzles (seeded; the official "1k" set is 1000).
        min_rating: CSV only: keep puzzles with at least this many tdoku backtracks.
        val_size: test puzzles used for validation.
        test_size: test puzzles used for testing (None = all, 423K in the full set).
        batch_size, eval_batch_size, steps_per_epoch, seed, augment: as for ``SudokuDataModule``.
    """

    def __init__(
        self,
        path: str,
        subsample: int | None = None,
        min_rating: int | None = None,
        val_size: int = 500,
        test_size: int | None = None,
        batch_size: int = 64,
        eval_batch_size: int = 250,
        steps_per_epoch: int = 250,
        seed: int = 0,
        augment: bool = True,
    ) -> None:
        super().__init__(9, batch_size, eval_batch_size, steps_per_epoch, seed, augment)
        self.path = Path(path).expanduser()
        self.subsample = subsample
        self.min_rating = min_rating
        self.val_size = val_size
        self.test_size = test_size

    def _read(self, split: str) -> dict[str, np.ndarray]:
        if (self.path / f"{split}.csv").is_file():
            return read_csv(self.path / f"{split}.csv", self.min_rating)
        if (self.path / split / "all__inputs.npy").is_file():
            if self.min_rating is not None:
                raise ValueError(
                    "data.min_rating needs the CSV layout (the builder's .npy files have no rating)"
                )
            return read_npy(self.path / split)
        raise FileNotFoundError(f"data.path={self.path}: {_MISSING}")

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        rng = np.random.default_rng(self.seed)
        train, test = self._read("train"), self._read("test")
        if self.subsample is not None:
            if not 0 < self.subsample <= len(train["inputs"]):
                raise ValueError(
                    f"data.subsample={self.subsample}: choose 1..{len(train['inputs'])} or null"
                )
            keep = np.sort(rng.choice(len(train["inputs"]), self.subsample, replace=False))
            train = {k: np.asarray(v[keep]) for k, v in train.items()}
        order = rng.permutation(len(test["inputs"]))
        val_idx = np.sort(order[: self.val_size])
        test_idx = np.sort(order[: self.test_size]) if self.test_size else np.arange(len(order))
        self.splits = {
            "train": train,
            "val": {k: np.asarray(v[val_idx]) for k, v in test.items()},
            "test": {k: np.asarray(v[test_idx]) for k, v in test.items()},
        }
