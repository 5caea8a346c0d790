"""What every benchmark result carries, and how its files are written.

    git_commit(dirty_paths)               -> the checkout's commit ("unknown" outside git; "-dirty" if those paths changed)
    write_pair(stem, result, markdown)    -> benchmarks/results/<stem>.json and <stem>.md
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def git_commit(dirty_paths: tuple[str, ...] = ()) -> str:
    """HEAD's hash, + "-dirty" when any of `dirty_paths` differs from HEAD in the working tree."""
    try:
        commit = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=RESULTS.parent, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    if dirty_paths and subprocess.run(["git", "diff", "--quiet", "HEAD", "--", *dirty_paths], cwd=RESULTS.parent).returncode:
        commit += "-dirty"
    return commit


def write_pair(stem: str, result: dict, markdown: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (RESULTS / f"{stem}.md").write_text(markdown)
