"""Sudoku for TRM: generated offline (no download), cached, streamed with on-the-fly augmentation.

Tokens follow the official builder (docs/trm.md §4): pad 0, blank 1, digit d -> d + 1; inputs and
labels are [N, n*n] uint8 arrays held in memory (1M boards x 81 bytes = 81 MB), so field note 002's
streaming/chunking knobs do not apply.

Training batches come from :class:`SudokuStream`, an infinite seeded stream whose batch at
position p is a pure function of (seed, p); its position is the trainer's ``global_step``, since
a TRM training step consumes exactly one batch and takes one optimizer step. So a resumed run sees
exactly the batches an uninterrupted one would, without relying on the loader state Lightning
saves one prefetched batch ahead.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, Dataset

from laptrain.data.sampler import LengthGroupedBatchSampler, replicas_of
from laptrain.families.trm.sudoku_generator import (
    BOX_SHAPES,
    GENERATOR_VERSION,
    TECHNIQUES,
    generate_puzzle,
    symmetry_fingerprint,
)

SPLITS = ("train", "val", "test")
CHUNK = 100  # puzzles per generation task; fixed so output does not depend on the worker count


def _generate_chunk(args: tuple[int, tuple[int, int], str | None, str]) -> list[tuple]:
    n, givens, technique, seed = args
    rng = random.Random(seed)
    out = []
    for _ in range(CHUNK):
        p = generate_puzzle(n, givens, rng, technique)
        kind = TECHNIQUES.index(p.technique)
        out.append((p.givens, p.solution, kind, p.guesses, symmetry_fingerprint(p.givens, n)))
    return out


def _split_rows(
    split: str,
    want: int,
    task: tuple[int, tuple[int, int], str | None, int],
    seen: set[bytes],
    workers: int,
    pool: ProcessPoolExecutor | None,
) -> list[tuple]:
    """``want`` puzzles of ``split`` none of which is in ``seen`` (up to symmetry); their
    fingerprints are added to ``seen``. ``task``: board size, givens, technique and seed."""
    board_size, givens, technique, seed = task
    rows: list[tuple] = []
    prints: list[bytes] = []
    chunk, dropped, start = 0, 0, time.perf_counter()
    while len(rows) < want:
        if chunk > 20 + 5 * (want // CHUNK + 1):
            raise ValueError(
                f"data: only {len(rows)}/{want} {split} puzzles differ from the other splits "
                f"for board {board_size} with givens {list(givens)}; lower data.{split}_size"
            )
        # the chunks still needed if none is dropped, at most two a worker: a 16-puzzle split
        # generates one chunk, not four (the rows are the same: chunks are seeded by position)
        batch = min(max(1, workers) * 2, -(-(want - len(rows)) // CHUNK))
        tasks = [
            (board_size, givens, technique, f"{seed}-{split}-{chunk + i}") for i in range(batch)
        ]
        chunks = pool.map(_generate_chunk, tasks) if pool else map(_generate_chunk, tasks)
        chunk += batch
        for part in chunks:
            for row in part:
                if len(rows) >= want:
                    break
                if row[4] in seen:
                    dropped += 1
                    continue
                rows.append(row)
                prints.append(row[4])
        rate = len(rows) / max(time.perf_counter() - start, 1e-9)
        rank_zero_info(
            f"sudoku: {split} {len(rows)}/{want} puzzles ({rate:.0f}/s, {dropped} dropped "
            "as symmetric to an earlier split)"
        )
    seen.update(prints)
    return rows


def _split_arrays(rows: list[tuple]) -> dict[str, np.ndarray]:
    return {
        "inputs": np.array([r[0] for r in rows], dtype=np.uint8) + 1,
        "labels": np.array([r[1] for r in rows], dtype=np.uint8) + 1,
        "givens": np.array([sum(1 for d in r[0] if d) for r in rows], dtype=np.int16),
        "technique": np.array([r[2] for r in rows], dtype=np.int8),
        "guesses": np.array([r[3] for r in rows], dtype=np.int32),
    }


def generate_splits(
    board_size: int,
    givens: tuple[int, int],
    counts: dict[str, int],
    seed: int,
    technique: str | None = None,
    workers: int = 0,
) -> dict[str, dict[str, np.ndarray]]:
    """Generate disjoint splits: a val/test puzzle equal to an earlier split's up to symmetry is dropped.

    Each split has its own seeds (``{seed}-{split}-{chunk}``); ``workers`` > 0 uses processes.
    Returns per split: inputs, labels (tokens), givens, technique (index into TECHNIQUES), guesses.
    """
    seen: set[bytes] = set()
    result = {}
    pool = ProcessPoolExecutor(max_workers=workers) if workers > 0 else None
    try:
        for split in SPLITS:
            task = (board_size, givens, technique, seed)
            rows = _split_rows(split, counts[split], task, seen, workers, pool)
            result[split] = _split_arrays(rows)
    finally:
        if pool is not None:
            pool.shutdown()
    return result


def augment(
    inputs: np.ndarray, labels: np.ndarray, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Validity-preserving random transforms per row: digit relabelling, band/row and stack/column
    shuffles, and a transpose with p = 0.5 on square-box boards (docs/trm.md §4)."""
    br, bc = BOX_SHAPES[n]
    batch = inputs.shape[0]
    index = np.empty((batch, n * n), dtype=np.int64)
    digit_map = np.empty((batch, n + 2), dtype=inputs.dtype)
    for b in range(batch):
        rows = np.concatenate(
            [band * br + rng.permutation(br) for band in rng.permutation(n // br)]
        )
        cols = np.concatenate([st * bc + rng.permutation(bc) for st in rng.permutation(n // bc)])
        grid = rows[:, None] * n + cols[None, :]
        if br == bc and rng.random() < 0.5:
            grid = grid.T
        index[b] = grid.reshape(-1)
        digit_map[b, :2] = (0, 1)
        digit_map[b, 2:] = rng.permutation(n) + 2
    new_inputs = np.take_along_axis(
        digit_map, np.take_along_axis(inputs, index, 1).astype(np.int64), 1
    )
    new_labels = np.take_along_axis(
        digit_map, np.take_along_axis(labels, index, 1).astype(np.int64), 1
    )
    return new_inputs, new_labels


class SudokuStream:
    """Infinite seeded stream of training batches; ``len`` is one epoch of ``steps_per_epoch``.

    The batch at position p draws ``batch_size * replicas`` puzzles with
    ``np.random.default_rng([seed, p])`` and augments them; process ``rank`` of ``replicas`` (DDP)
    keeps its ``batch_size`` of them, so 2 ranks x 8 train on the puzzles 1 rank x 16 would. Iteration starts at ``position()`` (the trainer's global step) and runs to
    the end of the current epoch, so a mid-epoch resume yields only the rest of that epoch.
    ``state_dict`` records the seed and batch size; loading a checkpoint made with others warns.
    """

    def __init__(
        self,
        inputs: np.ndarray,
        labels: np.ndarray,
        board_size: int,
        batch_size: int,
        steps_per_epoch: int,
        seed: int,
        augment: bool,
        position: Callable[[], int],
        replicas: int = 1,
        rank: int = 0,
    ) -> None:
        self.inputs, self.labels = inputs, labels
        self.replicas, self.rank = replicas, rank
        self.board_size = board_size
        self.batch_size = batch_size
        self.steps_per_epoch = steps_per_epoch
        self.seed = seed
        self.augment = augment
        self.position = position

    def __len__(self) -> int:
        return self.steps_per_epoch

    def batch_at(self, position: int) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng([self.seed, position])
        idx = rng.integers(0, len(self.inputs), self.batch_size * self.replicas)
        inputs, labels = self.inputs[idx], self.labels[idx]
        if self.augment:
            inputs, labels = augment(inputs, labels, self.board_size, rng)
        mine = slice(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
        inputs, labels = inputs[mine], labels[mine]
        return {
            "inputs": torch.from_numpy(inputs.astype(np.int64)),
            "labels": torch.from_numpy(labels.astype(np.int64)),
        }

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        start = self.position()
        end = (start // self.steps_per_epoch + 1) * self.steps_per_epoch
        for position in range(start, end):
            yield self.batch_at(position)

    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, "seed": self.seed, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state.get("seed"), state.get("batch_size")) != (self.seed, self.batch_size):
            rank_zero_warn(
                f"resuming with data.seed/batch_size {self.seed}/{self.batch_size} but the checkpoint "
                f"used {state.get('seed')}/{state.get('batch_size')}: the batch stream differs"
            )


class BoardDataset(Dataset):
    """Fixed (not augmented) boards for validation and test."""

    def __init__(self, inputs: np.ndarray, labels: np.ndarray) -> None:
        self.inputs = torch.from_numpy(np.asarray(inputs, dtype=np.int64))
        self.labels = torch.from_numpy(np.asarray(labels, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"inputs": self.inputs[i], "labels": self.labels[i]}


class SudokuBoardsDataModule(pl.LightningDataModule):
    """Loaders over in-memory boards; subclasses fill ``self.splits`` in ``setup``."""

    shards_itself = True  # data.contracts.ShardsItself: each rank's share, resumable stream

    def __init__(
        self,
        board_size: int,
        batch_size: int,
        eval_batch_size: int,
        steps_per_epoch: int,
        seed: int,
        augment: bool,
    ) -> None:
        super().__init__()
        if batch_size < 1 or eval_batch_size < 1 or steps_per_epoch < 1:
            raise ValueError("data batch_size, eval_batch_size and steps_per_epoch must be >= 1")
        if board_size not in BOX_SHAPES:
            raise ValueError(f"data board_size={board_size}: choose one of {sorted(BOX_SHAPES)}")
        self.board_size = board_size
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.steps_per_epoch = steps_per_epoch
        self.seed = seed
        self.augment = augment
        self.splits: dict[str, dict[str, np.ndarray]] = {}

    def model_kwargs(self) -> dict[str, int]:
        """What the model needs from the data: vocabulary (pad, blank, digits) and cells."""
        return {"vocab_size": self.board_size + 2, "seq_len": self.board_size**2}

    def _global_step(self) -> int:
        return self.trainer.global_step if self.trainer is not None else 0

    def train_dataloader(self) -> SudokuStream:
        train = self.splits["train"]
        replicas, rank = replicas_of(self.trainer)
        return SudokuStream(
            train["inputs"],
            train["labels"],
            self.board_size,
            self.batch_size,
            self.steps_per_epoch,
            self.seed,
            self.augment,
            self._global_step,
            replicas,
            rank,
        )

    def _eval_loader(self, split: str) -> DataLoader:
        """The boards in order; under several processes each rank takes its share of every
        batch of ``eval_batch_size * replicas`` (``laptrain.data.sampler``). One process keeps a
        plain loader, which ``trainer.predict`` can rebuild to track indices."""
        data = self.splits[split]
        boards = BoardDataset(data["inputs"], data["labels"])
        replicas, rank = replicas_of(self.trainer)
        if replicas == 1:
            return DataLoader(boards, batch_size=self.eval_batch_size)
        batches = LengthGroupedBatchSampler(
            [1] * len(data["inputs"]),
            self.eval_batch_size,
            shuffle=False,
            replicas=replicas,
            rank=rank,
        )
        return DataLoader(boards, batch_sampler=batches)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")


class SudokuDataModule(SudokuBoardsDataModule):
    """Generated Sudoku: ``givens: [lo, hi]`` per puzzle, optional technique class, per-split seeds.

    The splits are cached in ``cache_dir/sudoku/<key>.npz``, keyed by generator version, board,
    givens, technique, seed and counts; a second run loads them in well under a second.

    Args:
        board_size: 4, 6 or 9.
        givens: [lo, hi] number of given cells (the main difficulty knob).
        technique: None, or keep only puzzles whose cheapest technique is ``naked_singles``,
            ``hidden_singles`` or ``search``.
        train_size, val_size, test_size: puzzles per split (val/test never symmetric to train).
        batch_size: carry slots = puzzles per training step (the effective batch).
        eval_batch_size: puzzles per validation/test batch.
        steps_per_epoch: training batches per epoch (the stream itself is infinite).
        seed: generation and stream seed.
        augment: random symmetries on training batches.
        workers: generation processes (0 = in this process).
        cache_dir: where generated splits are kept; None = no cache.
    """

    def __init__(
        self,
        board_size: int = 9,
        givens: Sequence[int] = (40, 45),
        technique: str | None = None,
        train_size: int = 6000,
        val_size: int = 500,
        test_size: int = 500,
        batch_size: int = 64,
        eval_batch_size: int = 250,
        steps_per_epoch: int = 250,
        seed: int = 0,
        augment: bool = True,
        workers: int = 0,
        cache_dir: str | None = None,
    ) -> None:
        super().__init__(board_size, batch_size, eval_batch_size, steps_per_epoch, seed, augment)
        lo, hi = (int(g) for g in givens)
        cells = board_size * board_size
        if not 0 < lo <= hi <= cells:
            raise ValueError(f"data.givens={list(givens)}: need 0 < lo <= hi <= {cells}")
        if technique is not None and technique not in TECHNIQUES:
            raise ValueError(f"data.technique={technique!r}: choose null or one of {TECHNIQUES}")
        self.givens = (lo, hi)
        self.technique = technique
        self.counts = {"train": train_size, "val": val_size, "test": test_size}
        if min(self.counts.values()) < 1:
            raise ValueError("data train_size, val_size and test_size must be >= 1")
        self.workers = workers
        self.cache_dir = cache_dir

    def cache_key(self) -> str:
        spec = {
            "version": GENERATOR_VERSION,
            "board": self.board_size,
            "givens": list(self.givens),
            "technique": self.technique,
            "seed": self.seed,
            "counts": self.counts,
        }
        return hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]

    def _cache_path(self) -> Path | None:
        if self.cache_dir is None:
            return None
        return Path(self.cache_dir) / "sudoku" / f"{self.cache_key()}.npz"

    def prepare_data(self) -> None:
        path = self._cache_path()
        if self.splits or (path is not None and path.exists()):
            return
        self.splits = generate_splits(
            self.board_size, self.givens, self.counts, self.seed, self.technique, self.workers
        )
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
            flat = {f"{s}__{k}": v for s, arrays in self.splits.items() for k, v in arrays.items()}
            np.savez(tmp, **flat)
            os.replace(tmp, path)

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        path = self._cache_path()
        if path is None or not path.exists():
            self.prepare_data()
            return
        with np.load(path) as data:
            self.splits = {
                s: {k.split("__", 1)[1]: data[k] for k in data.files if k.startswith(f"{s}__")}
                for s in SPLITS
            }
