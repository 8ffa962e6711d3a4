"""Offline Sudoku generator: random full grids, unique-solution digging, difficulty labels.

Pure Python with bitmasks (docs/trm.md §8): a full grid by randomized backtracking that always fills
the cell with the fewest candidates; then cells are blanked in random order, undoing any blank
after which the puzzle no longer has exactly one solution (a counter that stops at 2). Boards are
4x4 (2x2 boxes), 6x6 (2x3 boxes) and 9x9 (3x3 boxes). Grids here hold digits 1..n and 0 for blank.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

GENERATOR_VERSION = 1  # bump when output for a given seed changes (it keys the cache)
BOX_SHAPES = {4: (2, 2), 6: (2, 3), 9: (3, 3)}
TECHNIQUES = ("naked_singles", "hidden_singles", "search")


@dataclass(frozen=True)
class Geometry:
    """Cell -> row, column and box index for an n x n board with boxes of box_rows x box_cols."""

    n: int
    box_rows: int
    box_cols: int
    rows: tuple[int, ...]
    cols: tuple[int, ...]
    boxes: tuple[int, ...]
    units: tuple[tuple[int, ...], ...]

    @property
    def full(self) -> int:
        return (1 << self.n) - 1


@cache
def geometry(n: int) -> Geometry:
    if n not in BOX_SHAPES:
        raise ValueError(f"data board_size={n}: choose one of {sorted(BOX_SHAPES)}")
    br, bc = BOX_SHAPES[n]
    cells = range(n * n)
    rows = tuple(i // n for i in cells)
    cols = tuple(i % n for i in cells)
    boxes = tuple((r // br) * (n // bc) + c // bc for r, c in zip(rows, cols, strict=True))
    units = tuple(
        tuple(i for i in cells if key[i] == u) for key in (rows, cols, boxes) for u in range(n)
    )
    return Geometry(n, br, bc, rows, cols, boxes, units)


def _masks(grid: Sequence[int], g: Geometry) -> tuple[list[int], list[int], list[int]] | None:
    """Used-digit bitmasks per row, column and box; None if the givens already clash."""
    rm, cm, bm = [0] * g.n, [0] * g.n, [0] * g.n
    for i, d in enumerate(grid):
        if d:
            bit = 1 << (d - 1)
            r, c, b = g.rows[i], g.cols[i], g.boxes[i]
            if (rm[r] | cm[c] | bm[b]) & bit:
                return None
            rm[r] |= bit
            cm[c] |= bit
            bm[b] |= bit
    return rm, cm, bm


def _fewest_candidates(
    grid: list[int], empty: list[int], g: Geometry, rm: list[int], cm: list[int], bm: list[int]
) -> tuple[int, int, int]:
    """(cell, candidate bitmask, candidate count) of the first blank cell of ``empty`` with the
    fewest candidates (MRV); cell -1 when no cell is blank."""
    best, best_free, best_n = -1, 0, g.n + 1
    for i in empty:
        if grid[i]:
            continue
        free = g.full & ~(rm[g.rows[i]] | cm[g.cols[i]] | bm[g.boxes[i]])
        k = free.bit_count()
        if k < best_n:
            best, best_free, best_n = i, free, k
            if k <= 1:
                break
    return best, best_free, best_n


def _search(
    grid: list[int], g: Geometry, limit: int, rng: random.Random | None, stats: list[int]
) -> int:
    """Count solutions up to ``limit`` by MRV backtracking, filling ``grid`` with the first one.

    ``rng`` shuffles digit order (None = ascending, the fixed solver); ``stats[0]`` counts branch
    points (cells tried with two or more candidates), the guess count.
    """
    masks = _masks(grid, g)
    if masks is None:
        return 0
    rm, cm, bm = masks
    empty = [i for i, d in enumerate(grid) if not d]
    solution: list[int] = []
    count = 0

    def recurse() -> None:
        nonlocal count
        best, best_free, best_n = _fewest_candidates(grid, empty, g, rm, cm, bm)
        if best < 0:
            count += 1
            if not solution:
                solution.extend(grid)
            return
        if best_n == 0:
            return
        if best_n > 1:
            stats[0] += 1
        digits = [d for d in range(1, g.n + 1) if best_free >> (d - 1) & 1]
        if rng is not None:
            rng.shuffle(digits)
        r, c, b = g.rows[best], g.cols[best], g.boxes[best]
        for d in digits:
            bit = 1 << (d - 1)
            grid[best] = d
            rm[r] |= bit
            cm[c] |= bit
            bm[b] |= bit
            recurse()
            rm[r] &= ~bit
            cm[c] &= ~bit
            bm[b] &= ~bit
            grid[best] = 0
            if count >= limit:
                return

    recurse()
    if solution:
        grid[:] = solution
    return count


def count_solutions(puzzle: Sequence[int], n: int, limit: int = 2) -> int:
    """Number of solutions of ``puzzle``, counting stops at ``limit``."""
    return _search(list(puzzle), geometry(n), limit, None, [0])


def solve(puzzle: Sequence[int], n: int) -> tuple[list[int] | None, int]:
    """(first solution or None, guess count of the fixed ascending-digit MRV solver)."""
    grid, stats = list(puzzle), [0]
    found = _search(grid, geometry(n), 1, None, stats)
    return (grid if found else None), stats[0]


def random_full_grid(n: int, rng: random.Random) -> list[int]:
    grid = [0] * (n * n)
    _search(grid, geometry(n), 1, rng, [0])
    return grid


def technique_class(puzzle: Sequence[int], n: int) -> str:
    """Cheapest technique family that solves the puzzle: naked singles, + hidden singles, search."""
    g = geometry(n)
    grid = list(puzzle)
    used_hidden = False
    while True:
        masks = _masks(grid, g)
        if masks is None:
            return "search"
        rm, cm, bm = masks
        free = {
            i: g.full & ~(rm[g.rows[i]] | cm[g.cols[i]] | bm[g.boxes[i]])
            for i, d in enumerate(grid)
            if not d
        }
        if not free:
            return "hidden_singles" if used_hidden else "naked_singles"
        naked = [(i, f) for i, f in free.items() if f.bit_count() == 1]
        if naked:
            for i, f in naked:
                grid[i] = f.bit_length()
            continue
        placed = False
        for unit in g.units:
            for d in range(g.n):
                spots = [i for i in unit if i in free and free[i] >> d & 1]
                if len(spots) == 1:
                    grid[spots[0]] = d + 1
                    placed = True
                    break
            if placed:
                break
        if not placed:
            return "search"
        used_hidden = True


@dataclass(frozen=True)
class Puzzle:
    givens: tuple[int, ...]
    solution: tuple[int, ...]
    technique: str
    guesses: int


def dig(solution: Sequence[int], n: int, target_givens: int, rng: random.Random) -> list[int]:
    """Blank cells in random order while the solution stays unique, down to ``target_givens``."""
    puzzle = list(solution)
    order = list(range(n * n))
    rng.shuffle(order)
    givens = n * n
    for i in order:
        if givens <= target_givens:
            break
        digit, puzzle[i] = puzzle[i], 0
        if count_solutions(puzzle, n, 2) == 1:
            givens -= 1
        else:
            puzzle[i] = digit
    return puzzle


def generate_puzzle(
    n: int, givens: tuple[int, int], rng: random.Random, technique: str | None = None
) -> Puzzle:
    """One unique-solution puzzle with lo..hi givens (and the technique class, when asked).

    Raises:
        RuntimeError: 200 grids in a row could not reach the range (too few givens for this size).
    """
    lo, hi = givens
    for _ in range(200):
        solution = random_full_grid(n, rng)
        target = rng.randint(lo, hi)
        puzzle = dig(solution, n, target, rng)
        count = sum(1 for d in puzzle if d)
        if not lo <= count <= hi:
            continue
        kind = technique_class(puzzle, n)
        if technique is not None and kind != technique:
            continue
        _, guesses = solve(puzzle, n)
        return Puzzle(tuple(puzzle), tuple(solution), kind, guesses)
    raise RuntimeError(
        f"no {n}x{n} puzzle with {lo}-{hi} givens"
        + (f" and technique {technique}" if technique else "")
        + " after 200 grids; raise data.givens"
    )


def symmetry_fingerprint(puzzle: Sequence[int], n: int) -> bytes:
    """A digest that is equal for puzzles equal up to the Sudoku symmetries.

    Invariant under digit relabelling, row swaps within a band, band swaps, the same for columns
    and stacks, and transposition: it only uses per-given counts (givens sharing its row / column /
    box / band / stack, same-digit givens overall and per band / stack), with row-vs-column pairs
    sorted. Different puzzles may collide (then the later split drops one: safe for disjointness).
    """
    g = geometry(n)
    cells = [i for i, d in enumerate(puzzle) if d]
    band = {i: g.rows[i] // g.box_rows for i in cells}
    stack = {i: g.cols[i] // g.box_cols for i in cells}
    count: dict[tuple, int] = {}
    keys = {
        i: (
            ("r", g.rows[i]),
            ("c", g.cols[i]),
            ("b", g.boxes[i]),
            ("B", band[i]),
            ("S", stack[i]),
            ("d", puzzle[i]),
            ("dB", puzzle[i], band[i]),
            ("dS", puzzle[i], stack[i]),
        )
        for i in cells
    }
    for ks in keys.values():
        for k in ks:
            count[k] = count.get(k, 0) + 1
    features = []
    for i in cells:
        r, c, b, bd, st, d, dbd, dst = (count[k] for k in keys[i])
        features.append(
            (min(r, c), max(r, c), b, min(bd, st), max(bd, st), d, min(dbd, dst), max(dbd, dst))
        )
    return hashlib.blake2b(repr(sorted(features)).encode(), digest_size=16).digest()
