"""Compare two calibrate scores files of the same pack (e.g. GPU bf16 vs CPU float32).

    python3 packs/data/compare_scores.py A/scores.jsonl B/scores.jsonl
      --> rows and question scores in both, |Δp| mean, 95th percentile, max

Only rows present in both files are compared (a CPU run may cover the first rows only).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from spinf_jobs.calibrate_command import read_scores


def score_differences(a: Path, b: Path) -> tuple[int, np.ndarray]:
    rows_a = {row.id: row for row in read_scores(a)[0]}
    rows_b = {row.id: row for row in read_scores(b)[0]}
    shared = [i for i in rows_a if i in rows_b]
    diffs = [abs(rows_a[i].questions[q] - rows_b[i].questions[q])
             for i in shared for q in rows_a[i].questions if q in rows_b[i].questions]
    return len(shared), np.asarray(diffs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    args = parser.parse_args()
    num_rows, diffs = score_differences(args.a, args.b)
    if not diffs.size:
        raise SystemExit("no question scores in both files")
    print(f"{num_rows} rows, {diffs.size} question scores: |Δp| mean {diffs.mean():.4f},"
          f" 95th percentile {np.percentile(diffs, 95):.4f}, max {diffs.max():.4f}")


if __name__ == "__main__":
    main()
