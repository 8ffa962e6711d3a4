from collections import Counter

import pytest

from laptrain.data.file_formats import DataError
from laptrain.data.splits import assign_folds, assign_splits, check_folds
from laptrain.families.classifier.train_fraction import train_subset


def test_every_label_gets_its_share_and_the_same_seed_gives_the_same_split():
    labels = ["a"] * 300 + ["b"] * 100
    where = assign_splits(labels, range(400), {"val": 0.1, "test": 0.1}, seed=0)
    counts = Counter(zip(labels, where, strict=True))
    assert counts[("a", "val")] == 30 and counts[("b", "val")] == 10
    assert counts[("a", "test")] == 30 and counts[("b", "test")] == 10
    assert assign_splits(labels, range(400), {"val": 0.1, "test": 0.1}, seed=0) == where
    assert assign_splits(labels, range(400), {"val": 0.1, "test": 0.1}, seed=1) != where


def test_groups_stay_whole_and_a_huge_group_stays_in_train():
    labels = ["a"] * 100
    groups = [0] * 50 + [1 + i // 5 for i in range(50)]
    where = assign_splits(labels, groups, {"val": 0.2}, seed=3)
    assert {w for w, g in zip(where, groups, strict=True) if g == 0} == {"train"}
    for g in set(groups):
        assert len({w for w, k in zip(where, groups, strict=True) if k == g}) == 1
    assert 15 <= where.count("val") <= 25


def test_train_subset_keeps_each_labels_share_and_the_same_rows_for_a_seed():
    labels = ["a"] * 60 + ["b"] * 30 + ["c"] * 3
    keep = train_subset(labels, 0.2, seed=1)
    assert Counter(labels[i] for i in keep) == {"a": 12, "b": 6, "c": 1}  # c keeps at least one
    assert keep == sorted(keep) and keep == train_subset(labels, 0.2, seed=1)
    assert keep != train_subset(labels, 0.2, seed=2)
    assert train_subset(labels, 1.0, seed=1) == list(range(len(labels)))
    for bad in (0, -0.5, 1.5):
        with pytest.raises(ValueError, match="data.train_fraction"):
            train_subset(labels, bad, seed=1)


def test_every_row_is_in_exactly_one_fold_each_label_spread_and_groups_whole():
    labels = ["a"] * 150 + ["b"] * 50
    groups = [i // 2 for i in range(200)]  # pairs of rows
    numbers = assign_folds(labels, groups, folds=5, seed=0)
    assert sorted(set(numbers)) == [0, 1, 2, 3, 4] and len(numbers) == 200
    counts = Counter(zip(labels, numbers, strict=True))
    assert all(counts[("a", f)] == 30 and counts[("b", f)] == 10 for f in range(5))
    for g in set(groups):
        assert len({n for n, k in zip(numbers, groups, strict=True) if k == g}) == 1
    assert assign_folds(labels, groups, folds=5, seed=0) == numbers
    assert assign_folds(labels, groups, folds=5, seed=1) != numbers


def test_the_folds_validate_on_disjoint_rows_and_never_on_the_held_out_test_split():
    labels = ["a"] * 90 + ["b"] * 30
    fractions = {"val": 0.1, "test": 0.2}
    runs = [assign_splits(labels, range(120), fractions, seed=7, folds=4, fold=f) for f in range(4)]
    tests = [{i for i, w in enumerate(where) if w == "test"} for where in runs]
    assert all(t == tests[0] for t in tests) and len(tests[0]) == 24  # val_fraction unused
    vals = [{i for i, w in enumerate(where) if w == "val"} for where in runs]
    assert set().union(*vals) == set(range(120)) - tests[0]  # every other row validates once
    assert sum(len(v) for v in vals) == 96 and all(len(v) == 24 for v in vals)
    assert (
        assign_splits(labels, range(120), {"val": 0.1}, seed=7, folds=4, fold=0).count("val") == 30
    )


def test_a_fold_outside_the_folds_is_refused_in_one_line_naming_the_fix():
    with pytest.raises(
        DataError, match=r"data.fold=5 is not a fold of data.folds=5: use data.fold=0..4"
    ):
        check_folds(5, 5)
    with pytest.raises(DataError, match="data.fold=2 needs data.folds"):
        check_folds(None, 2)
    with pytest.raises(DataError, match="data.folds=1: use 2 folds or more"):
        check_folds(1, 0)
    with pytest.raises(DataError, match="set data.files.validation=null or data.folds=null"):
        check_folds(5, 0, validation_file=True)
    check_folds(None, 0)
    check_folds(5, 4)
