"""The tokenized-data cache: a rerun's time to the first optimizer step over the first run's.

On a long-tailed CSV of ``--rows`` rows (benchmarks/longtail.py), each repeat starts with an empty
cache folder and runs ``python train.py data=text_csv data.files.train=<csv>`` twice, timed to the
first optimizer step as in startup.py: the first run reads the CSV, trains the tokenizer and
tokenizes every row; the second finds all of that in the cache. Pairs are run back to back and the
ratio is the median over repeats.

    python benchmarks/cache.py [--rows 100000] [--repeats 3] [train.py overrides ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from arms import machine_line
from longtail import write_longtail_csv
from startup import one_run

GOAL = 0.2  # issue 13: second run's time to first step <= 0.2 x the first's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="more train.py overrides")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="laptrain-cache-") as tmp:
        csv = write_longtail_csv(Path(tmp) / "rows.csv", args.rows)
        argv = [
            "data=text_csv",
            f"data.files.train={csv}",
            *args.overrides,
            "test=false",
            "resume=false",
        ]
        pairs = []
        for i in range(args.repeats):
            folder = Path(tmp) / f"repeat{i}"
            folder.mkdir()
            pairs.append((one_run(argv, folder), one_run(argv, folder)))
    first = statistics.median(p[0]["total"] for p in pairs)
    second = statistics.median(p[1]["total"] for p in pairs)
    ratio = statistics.median(p[1]["total"] / p[0]["total"] for p in pairs)
    data_first = statistics.median(p[0].get("data + tokenizer", 0.0) for p in pairs)
    data_second = statistics.median(p[1].get("data + tokenizer", 0.0) for p in pairs)
    print(machine_line())
    print(f"{args.rows} rows, {args.repeats} repeats (empty cache, then warm), medians\n")
    print("| run | to first step, s | data + tokenizer, s | ratio to first run |")
    print("|---|---|---|---|")
    print(f"| first (empty cache) | {first:.2f} | {data_first:.2f} | 1.00 |")
    print(
        f"| second (cache warm) | {second:.2f} | {data_second:.2f} | {ratio:.2f} (goal <= {GOAL}) |"
    )


if __name__ == "__main__":
    main()
