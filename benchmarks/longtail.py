"""A long-tailed labelled text set built locally (no download), shared by vs_hf.py and cache.py.

Lengths follow a log-normal distribution (median ~20 words, p99 ~300), like user text sets where a
few long rows would set the padding of every random batch. Each label has its own vocabulary
mixed with shared filler words, so a small model can learn it in one epoch; ``noise`` is the share
of words drawn from another label's vocabulary.
"""

from __future__ import annotations

import csv
import math
import random
from pathlib import Path

TOPICS = {
    "sports": "match goal team score player coach league season win ball referee stadium",
    "cooking": "oven recipe salt butter flour bake simmer garlic pan dough spice kitchen",
    "weather": "rain cloud storm wind forecast sunny snow cold humid front pressure thunder",
    "finance": "market stock bond price bank loan rate profit trade fund asset budget",
}
FILLER = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "it",
    "that",
    "for",
    "on",
    "with",
    "as",
    "was",
    "at",
    "by",
    "this",
    "from",
]


def lengths(rows: int, seed: int, median: float = 20.0, sigma: float = 1.15) -> list[int]:
    """Word counts: log-normal around ``median`` (sigma 1.15 puts p99 near 15 x the median)."""
    rng = random.Random(seed)
    return [
        max(2, min(1000, int(rng.lognormvariate(math.log(median), sigma)))) for _ in range(rows)
    ]


def write_longtail_csv(path: Path, rows: int, seed: int = 0, noise: float = 0.35) -> Path:
    """``rows`` labelled texts (columns text,label) written to ``path``."""
    rng = random.Random(seed + 1)
    labels = list(TOPICS)
    vocab = {label: words.split() for label, words in TOPICS.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for i, n in enumerate(lengths(rows, seed)):
            label = labels[i % len(labels)]
            words = []
            for _ in range(n):
                r = rng.random()
                if r < 0.5:
                    words.append(rng.choice(FILLER))
                elif r < 0.5 + 0.5 * noise:
                    words.append(rng.choice(vocab[rng.choice(labels)]))
                else:
                    words.append(rng.choice(vocab[label]))
            writer.writerow([" ".join(words), label])
    return path
