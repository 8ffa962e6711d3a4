"""``data.train_fraction``: a seeded, stratified share of the train split, for tuning on less
data."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np


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
