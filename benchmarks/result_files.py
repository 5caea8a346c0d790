"""What every benchmark result carries, and how its files are named and written.

    git_commit(dirty_paths)                         -> the commit measured ($COMMIT in a copy without .git)
    new_result(**fields)                            -> {"commit": git_commit(), "date": today, **fields}
    result_path(benchmark, *what, suffix=".json")   -> benchmarks/results/<benchmark>-<what>-...<suffix>
    write_pair(result, markdown, benchmark, *what)  -> <that stem>.json and <that stem>.md
    write_json(result, benchmark, *what)            -> <that stem>.json

A result file is named by what it measures: the benchmark, then the model, the workload and
the variant ("throughput-gemma-3-12b-news", "throughput-gemma-3-12b-news-slots"), never by
its date or commit. A new run of the same measurement replaces the file (git keeps the old
one); the commit measured and the date are inside it, and writing a result without its
"commit" is refused.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
_NAME_PART = re.compile(r"[A-Za-z0-9._]+(-[A-Za-z0-9._]+)*")


def git_commit(dirty_paths: tuple[str, ...] = ()) -> str:
    """The $COMMIT the caller names (the GPU machine's copy of a working tree: its own git, if
    any, need not be at that tree's commit), else HEAD's hash, + "-dirty" when any of
    `dirty_paths` differs from HEAD in the working tree; "unknown" outside git."""
    if os.environ.get("COMMIT") not in (None, "", "unknown"):
        return os.environ["COMMIT"]
    try:
        commit = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=RESULTS.parent, text=True,
                                         stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    if dirty_paths and subprocess.run(["git", "diff", "--quiet", "HEAD", "--", *dirty_paths], cwd=RESULTS.parent,
                                     check=False).returncode:
        commit += "-dirty"
    return commit


def new_result(**fields) -> dict:
    """A result's opening fields: the commit measured and the date, then `fields`."""
    return {"commit": git_commit(), "date": datetime.date.today().isoformat(), **fields}


def result_path(benchmark: str, *what: str, suffix: str = ".json") -> Path:
    """The file of this measurement: `what` are its model, workload and variant (empty ones skipped)."""
    parts = [benchmark, *(part for part in what if part)]
    for part in parts:
        if not _NAME_PART.fullmatch(part):
            raise ValueError(f"{part!r}: a result name part is letters, digits, '.', '_' and '-' (a model, not a path)")
    RESULTS.mkdir(exist_ok=True)
    return RESULTS / ("-".join(parts) + suffix)


def write_json(result: dict, benchmark: str, *what: str) -> Path:
    if not result.get("commit"):
        raise ValueError("a result names the commit it measured (result['commit'])")
    path = result_path(benchmark, *what)
    path.write_text(json.dumps(result, indent=1))
    return path


def write_pair(result: dict, markdown: str, benchmark: str, *what: str) -> Path:
    path = write_json(result, benchmark, *what)
    path.with_suffix(".md").write_text(markdown)
    return path
