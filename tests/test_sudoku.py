"""Sudoku generator, splits, augmentation, the training stream, cache and Sudoku-Extreme files."""

from __future__ import annotations

import csv
import json
import random
import time
from pathlib import Path

import numpy as np
import pytest

from laptrain.families.trm.sudoku import SudokuDataModule, augment, generate_splits
from laptrain.families.trm.sudoku_extreme import SudokuExtremeDataModule
from laptrain.families.trm.sudoku_generator import (
    count_solutions,
    generate_puzzle,
    geometry,
    symmetry_fingerprint,
    technique_class,
)


def assert_valid_solution(grid, n: int) -> None:
    g = geometry(n)
    for unit in g.units:
        assert sorted(grid[i] for i in unit) == list(range(1, n + 1))


@pytest.mark.parametrize(("n", "givens"), [(4, (5, 8)), (6, (14, 20)), (9, (40, 45))])
def test_generated_puzzles_have_one_solution_in_the_givens_range(n, givens) -> None:
    rng = random.Random(1)
    for _ in range(5):
        p = generate_puzzle(n, givens, rng)
        assert_valid_solution(p.solution, n)
        assert givens[0] <= sum(1 for d in p.givens if d) <= givens[1]
        assert all(d in (0, s) for d, s in zip(p.givens, p.solution, strict=True))
        assert count_solutions(p.givens, n) == 1


def test_technique_class_and_filter() -> None:
    rng = random.Random(2)
    easy = generate_puzzle(9, (78, 80), rng)
    assert technique_class(easy.givens, 9) == "naked_singles"
    hard = generate_puzzle(9, (24, 30), rng, technique="search")
    assert hard.technique == "search" and hard.guesses >= 1
    with pytest.raises(ValueError, match="data board_size=5"):
        generate_puzzle(5, (10, 12), rng)


def test_fingerprint_is_invariant_under_the_symmetries() -> None:
    rng = random.Random(3)
    p = generate_puzzle(9, (30, 35), rng)
    inputs = np.array([p.givens], dtype=np.uint8) + 1
    labels = np.array([p.solution], dtype=np.uint8) + 1
    for seed in range(5):
        new_inputs, new_labels = augment(inputs, labels, 9, np.random.default_rng(seed))
        moved = (new_inputs[0] - 1).tolist()
        assert moved != list(p.givens)
        assert symmetry_fingerprint(moved, 9) == symmetry_fingerprint(p.givens, 9)
        assert_valid_solution((new_labels[0] - 1).tolist(), 9)
        given = new_inputs[0] > 1
        assert (new_inputs[0][given] == new_labels[0][given]).all()
    other = generate_puzzle(9, (30, 35), rng)
    assert symmetry_fingerprint(other.givens, 9) != symmetry_fingerprint(p.givens, 9)


def test_splits_are_disjoint_up_to_symmetry_and_tokenised() -> None:
    splits = generate_splits(4, (5, 7), {"train": 120, "val": 20, "test": 20}, seed=0)
    prints = {
        s: {symmetry_fingerprint((row - 1).tolist(), 4) for row in splits[s]["inputs"]}
        for s in splits
    }
    assert not prints["train"] & prints["val"]
    assert not (prints["train"] | prints["val"]) & prints["test"]
    assert splits["train"]["inputs"].shape == (120, 16)
    assert set(np.unique(splits["train"]["inputs"])) <= set(range(1, 6))  # blank 1, digits 2-5
    assert set(np.unique(splits["train"]["labels"])) == set(range(2, 6))


def test_a_small_split_generates_only_the_chunks_it_needs_and_the_same_puzzles(monkeypatch):
    import laptrain.families.trm.sudoku as sudoku

    want = {"train": 16, "val": 8, "test": 8}
    pooled = generate_splits(4, (5, 7), want, seed=3, workers=2)
    calls = []
    generate = sudoku._generate_chunk
    monkeypatch.setattr(
        sudoku, "_generate_chunk", lambda args: calls.append(args) or generate(args)
    )
    here = generate_splits(4, (5, 7), want, seed=3, workers=0)
    assert [c[3] for c in calls] == ["3-train-0", "3-val-0", "3-test-0"]  # not 2 chunks a split
    first = generate((4, (5, 7), None, "3-train-0"))[:16]
    assert here["train"]["inputs"].tolist() == [[d + 1 for d in row[0]] for row in first]
    for split in want:
        assert np.array_equal(pooled[split]["inputs"], here[split]["inputs"])


def test_too_few_distinct_puzzles_fails_with_the_fix() -> None:
    with pytest.raises(ValueError, match="lower data.val_size"):
        generate_splits(4, (15, 15), {"train": 50, "val": 50, "test": 1}, seed=0)


def small_data(tmp_path: Path, **kw) -> SudokuDataModule:
    args = dict(board_size=4, givens=(5, 8), train_size=30, val_size=5, test_size=5)
    args.update(kw)
    return SudokuDataModule(batch_size=8, steps_per_epoch=4, cache_dir=str(tmp_path), **args)


def test_second_run_loads_the_cache_fast(tmp_path: Path) -> None:
    first = small_data(tmp_path)
    first.prepare_data()
    first.setup("fit")
    assert len(list((tmp_path / "sudoku").glob("*.npz"))) == 1
    again = small_data(tmp_path)
    start = time.perf_counter()
    again.prepare_data()
    again.setup("fit")
    assert time.perf_counter() - start < 1.0
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(first.splits[split]["inputs"], again.splits[split]["inputs"])
    assert small_data(tmp_path, givens=(6, 8)).cache_key() != first.cache_key()


def test_stream_is_seeded_resumes_mid_epoch_and_augments(tmp_path: Path) -> None:
    data = small_data(tmp_path)
    data.prepare_data()
    data.setup("fit")
    stream = data.train_dataloader()
    assert len(stream) == 4
    epoch = list(stream)
    assert len(epoch) == 4
    stream.position = lambda: 6  # resumed at global step 6: the rest of the second epoch
    rest = list(stream)
    assert len(rest) == 2
    np.testing.assert_array_equal(rest[0]["inputs"], stream.batch_at(6)["inputs"])
    np.testing.assert_array_equal(epoch[1]["labels"], stream.batch_at(1)["labels"])
    assert not np.array_equal(epoch[0]["inputs"], epoch[1]["inputs"])
    for label_row in epoch[0]["labels"]:
        assert_valid_solution((label_row - 1).tolist(), 4)
    assert data.model_kwargs() == {"vocab_size": 6, "seq_len": 16}


def test_ranks_take_their_share_of_the_puzzles_one_process_would_train_on(tmp_path: Path) -> None:
    """Under DDP rank r of 2 at batch 4 trains on its half of the batch 1 rank at batch 8 draws
    (the same puzzles and augmentations), and on its half of every validation batch."""
    from laptrain.families.trm.sudoku import SudokuStream

    data = small_data(tmp_path)
    data.prepare_data()
    data.setup("fit")
    train = data.splits["train"]

    def stream(batch: int, replicas: int = 1, rank: int = 0) -> SudokuStream:
        return SudokuStream(
            train["inputs"], train["labels"], 4, batch, 4, 0, True, lambda: 0, replicas, rank
        )

    whole = stream(8).batch_at(3)
    halves = [stream(4, 2, r).batch_at(3) for r in (0, 1)]
    for key in ("inputs", "labels"):
        np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), whole[key])

    class Trainer:  # what the datamodule asks of the Trainer it is attached to
        world_size, global_rank = 2, 1

    data.eval_batch_size = 2
    data.trainer = Trainer()
    rank1 = [b["inputs"] for b in data.val_dataloader()]
    data.trainer = None
    rows = data.splits["val"]["inputs"]
    # 5 boards in global batches of 4: rank 1 takes boards 2-3, then board 4, which rank 0 also
    # takes (fewer boards than ranks are repeated rather than leave a rank without a batch)
    assert [len(b) for b in rank1] == [2, 1]
    np.testing.assert_array_equal(np.concatenate(rank1), rows[[2, 3, 4]])


def test_bad_data_options_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="data board_size=5"):
        small_data(tmp_path, board_size=5)
    with pytest.raises(ValueError, match=r"data.givens=\[9, 3\]"):
        small_data(tmp_path, givens=(9, 3))
    with pytest.raises(ValueError, match="data.technique='hard'"):
        small_data(tmp_path, technique="hard")


def write_extreme_csv(folder: Path, rng: random.Random) -> list:
    folder.mkdir(parents=True)
    puzzles = []
    for split, count in (("train", 12), ("test", 6)):
        with (folder / f"{split}.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["source", "question", "answer", "rating"])
            for i in range(count):
                p = generate_puzzle(9, (50, 60), rng)
                q = "".join(str(d) if d else "." for d in p.givens)
                writer.writerow(["gen", q, "".join(map(str, p.solution)), i])
                puzzles.append(p)
    return puzzles


def test_extreme_csv_layout_uses_the_official_tokens(tmp_path: Path) -> None:
    puzzles = write_extreme_csv(tmp_path / "csv", random.Random(4))
    data = SudokuExtremeDataModule(str(tmp_path / "csv"), min_rating=3, val_size=2, subsample=5)
    data.setup("fit")
    assert data.splits["train"]["inputs"].shape == (5, 81)
    assert (data.splits["train"]["rating"] >= 3).all()
    assert len(data.splits["test"]["inputs"]) == 3  # test ratings 0..5, >= 3 kept
    train_tokens = {tuple(d + 1 for d in p.givens) for p in puzzles[:12]}
    assert {tuple(r) for r in data.splits["train"]["inputs"].tolist()} <= train_tokens
    blank = data.splits["train"]["inputs"] == 1
    assert blank.any() and (data.splits["train"]["labels"][blank] >= 2).all()
    assert data.model_kwargs() == {"vocab_size": 11, "seq_len": 81}


def test_extreme_npy_layout_and_missing_files(tmp_path: Path) -> None:
    rng = random.Random(5)
    for split, count in (("train", 8), ("test", 4)):
        folder = tmp_path / "npy" / split
        folder.mkdir(parents=True)
        ps = [generate_puzzle(9, (50, 60), rng) for _ in range(count)]
        np.save(folder / "all__inputs.npy", np.array([p.givens for p in ps], dtype=np.int32) + 1)
        np.save(folder / "all__labels.npy", np.array([p.solution for p in ps], dtype=np.int32) + 1)
        (folder / "dataset.json").write_text(json.dumps({"seq_len": 81, "vocab_size": 11}))
    data = SudokuExtremeDataModule(str(tmp_path / "npy"), val_size=2)
    data.setup("fit")
    assert data.splits["train"]["inputs"].shape == (8, 81)
    assert len(data.splits["val"]["inputs"]) == 2 and len(data.splits["test"]["inputs"]) == 4
    batch = next(iter(data.train_dataloader()))
    assert batch["inputs"].shape == (64, 81)
    with pytest.raises(ValueError, match="min_rating needs the CSV layout"):
        SudokuExtremeDataModule(str(tmp_path / "npy"), min_rating=1).setup("fit")
    with pytest.raises(FileNotFoundError, match="train.csv"):
        SudokuExtremeDataModule(str(tmp_path / "nothing")).setup("fit")
