"""Assigning rows to train / val / test: stratified by label, whole groups per split, seeded."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np


def assign_splits(
    labels: Sequence[str], groups: Sequence[Hashable], fractions: Mapping[str, float], seed: int
) -> list[str]:
    """The split name of every row (``"train"`` unless ``fractions`` claims it).

    Each label's groups (rows sharing a group key) are visited in a seeded order and given to the
    split furthest below its share of that label's rows. A group much larger than what a split still
    misses stays in train, so one big group (a 200-docstring module) cannot fill a small split.
    """
    rng = np.random.default_rng(seed)
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(groups):
        members.setdefault(key, []).append(i)
    by_label: dict[str, list[Hashable]] = {}
    for key, rows in members.items():
        names = [labels[i] for i in rows]
        by_label.setdefault(max(set(names), key=names.count), []).append(key)
    where = ["train"] * len(groups)
    for label in sorted(by_label):
        keys = sorted(by_label[label], key=str)
        rng.shuffle(keys)
        total = sum(len(members[k]) for k in keys)
        got = dict.fromkeys(fractions, 0)
        for key in keys:
            split = max(fractions, key=lambda s: total * fractions[s] - got[s])
            missing = total * fractions[split] - got[split]
            if missing > 0 and len(members[key]) <= max(1.5 * missing, 1):
                got[split] += len(members[key])
                for i in members[key]:
                    where[i] = split
    return where


def check_train_fraction(fraction: float) -> None:
    if not 0 < fraction <= 1:
        raise ValueError(f"data.train_fraction={fraction}: use a fraction in (0, 1]")


def train_subset(labels: Sequence[Hashable], fraction: float, seed: int) -> list[int]:
    """Row indices of a seeded, stratified ``fraction`` of a train split, in their order.

    For tuning on less data (``data.train_fraction``): every label keeps its share of rows (at
    least one), and the same seed keeps the same rows, every epoch and every trial, unlike
    ``trainer.limit_train_batches``, which takes the first batches of each epoch's shuffle.
    """
    check_train_fraction(fraction)
    if fraction == 1:
        return list(range(len(labels)))
    rng = np.random.default_rng(seed)
    by_label: dict[Hashable, list[int]] = {}
    for i, label in enumerate(labels):
        by_label.setdefault(label, []).append(i)
    keep: list[int] = []
    for label in sorted(by_label, key=str):
        rows = by_label[label]
        count = max(1, round(len(rows) * fraction))
        keep.extend(int(i) for i in rng.choice(rows, size=count, replace=False))
    return sorted(keep)
