"""What every benchmark result carries, and how its files are written.

    git_commit()                          -> the checkout's commit ("unknown" outside git)
    write_pair(stem, result, markdown)    -> benchmarks/results/<stem>.json and <stem>.md
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def git_commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=RESULTS.parent, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_pair(stem: str, result: dict, markdown: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (RESULTS / f"{stem}.md").write_text(markdown)
