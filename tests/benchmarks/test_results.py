"""benchmarks/results/ holds the current run of each measurement the docs cite, each file named
by what it measures and naming the commit it measured inside."""

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
CITING = [REPO / "README.md", REPO / "quantizations" / "README.md", *(REPO / "docs").glob("*.md"),
          *(REPO / "engine").rglob("*.py")]
NAME = re.compile(r"[a-z0-9][a-z0-9_.]*(-[a-z0-9_.]+)*\.(json|md|txt|log)")
DATE_OR_COMMIT = re.compile(r"\d{4}-\d{2}-\d{2}|(^|-)(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(-|\.)")
BRACES = re.compile(r"([\w./-]*)\{([^{}]+)\}([\w./-]*)")


def _files() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*") if p.is_file())


def _expanded(text: str) -> str:
    """`a-{b,c}.{json,md}` -> `a-b.json a-b.md a-c.json a-c.md`, as the docs abbreviate."""
    while (match := BRACES.search(text)):
        head, options, tail = match.groups()
        text = text[: match.start()] + " ".join(head + o + tail for o in options.split(",")) + text[match.end():]
    return text


def test_every_result_is_named_by_what_it_measures():
    files = _files()
    assert len(files) <= 42, len(files)
    for path in files:
        assert path.parent == RESULTS, f"{path}: no subfolders"
        assert NAME.fullmatch(path.name) and not DATE_OR_COMMIT.search(path.name), path.name


def test_every_result_names_the_commit_it_measured():
    for path in _files():
        if path.suffix == ".json":
            commit = json.loads(path.read_text()).get("commit")
            assert commit and commit != "unknown", path.name
        else:
            assert re.search(r"commit[: `]+[0-9a-f]{7}", path.read_text()[:2000]), path.name


def test_every_result_is_cited():
    cited = _expanded(" ".join(path.read_text() for path in CITING))
    uncited = [path.name for path in _files() if path.name not in cited]
    assert not uncited, uncited
