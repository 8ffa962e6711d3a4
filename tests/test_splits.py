from collections import Counter

import pytest

from laptrain.data.splits import assign_splits, train_subset


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
