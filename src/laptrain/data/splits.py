"""Assigning rows to train / val / test, or to k folds: stratified by label, whole groups per split,
seeded."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from laptrain.data.file_formats import DataError


def _groups_by_label(
    labels: Sequence[str], groups: Sequence[Hashable], seed: int
) -> tuple[dict[Hashable, list[int]], list[list[Hashable]]]:
    """The rows of each group, and each label's group keys in a seeded order (a group counts
    under its most frequent label)."""
    rng = np.random.default_rng(seed)
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(groups):
        members.setdefault(key, []).append(i)
    by_label: dict[str, list[Hashable]] = {}
    for key, rows in members.items():
        names = [labels[i] for i in rows]
        by_label.setdefault(max(set(names), key=names.count), []).append(key)
    ordered = []
    for label in sorted(by_label):
        keys = sorted(by_label[label], key=str)
        rng.shuffle(keys)
        ordered.append(keys)
    return members, ordered


def assign_splits(
    labels: Sequence[str],
    groups: Sequence[Hashable],
    fractions: Mapping[str, float],
    seed: int,
    folds: int | None = None,
    fold: int = 0,
) -> list[str]:
    """The split name of every row (``"train"`` unless ``fractions`` claims it).

    Each label's groups go, in a seeded order, to the split furthest below its share; a group much
    larger than a split still misses stays in train. With ``folds``, the other splits go first and
    fold ``fold`` of the rest (:func:`assign_folds`) is ``"val"``.
    """
    if folds is not None:
        held = {s: f for s, f in fractions.items() if s != "val"}
        where = assign_splits(labels, groups, held, seed)
        rest = [i for i, w in enumerate(where) if w == "train"]
        numbers = assign_folds([labels[i] for i in rest], [groups[i] for i in rest], folds, seed)
        for i, number in zip(rest, numbers, strict=True):
            if number == fold:
                where[i] = "val"
        return where
    members, ordered = _groups_by_label(labels, groups, seed)
    where = ["train"] * len(groups)
    if not fractions:
        return where
    for keys in ordered:
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


def assign_folds(
    labels: Sequence[str], groups: Sequence[Hashable], folds: int, seed: int
) -> list[int]:
    """The fold (``0..folds-1``) of every row: whole groups per fold, each label's groups given in
    a seeded order to the fold with the fewest rows of that label (then the fewest in all)."""
    check_folds(folds, 0)
    members, ordered = _groups_by_label(labels, groups, seed)
    where = [0] * len(groups)
    total = [0] * folds
    for keys in ordered:
        got = [0] * folds
        for key in keys:
            number = min(range(folds), key=lambda f: (got[f], total[f]))
            got[number] += len(members[key])
            total[number] += len(members[key])
            for i in members[key]:
                where[i] = number
    return where


def check_folds(folds: int | None, fold: int, validation_file: bool = False) -> None:
    """Refuse a fold that is not one of ``0..folds-1``, or folds beside a validation file."""
    if folds is None:
        if fold != 0:
            raise DataError(f"data.fold={fold} needs data.folds: set data.folds=<k>, e.g. 5")
        return
    if folds < 2:
        raise DataError(f"data.folds={folds}: use 2 folds or more, or data.folds=null")
    if not 0 <= fold < folds:
        raise DataError(
            f"data.fold={fold} is not a fold of data.folds={folds}: use data.fold=0..{folds - 1} "
            f"(e.g. -m data.fold={','.join(map(str, range(folds)))})"
        )
    if validation_file:
        raise DataError(
            f"data.folds={folds} makes fold {fold} the validation split, and "
            "data.files.validation gives one too: set data.files.validation=null or data.folds=null"
        )
