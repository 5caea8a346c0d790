"""The README's main job: the demo dataset as one job on the embedded service, then a summary.

    fixtures/demo/messages.jsonl + scoring.json (+ packs named with --pack) --POST /v1/jobs--> job
      --GET /v1/jobs/{id} (progress bar)--> succeeded --GET .../results (JSONL)--> summary tables
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import orjson
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

DEMO_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "demo"
NUM_EXAMPLE_ROWS = 12


def run_demo(service, token: str, dataset: Path | None, scoring: Path | None, packs: list[str] = ()) -> int:
    lines = (dataset or DEMO_DIR / "messages.jsonl").read_bytes().splitlines()
    rows = [orjson.loads(line) for line in lines if line.strip()]
    spec = orjson.loads((scoring or DEMO_DIR / "scoring.json").read_bytes())
    client = httpx.Client(base_url=service.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
    started = time.perf_counter()
    body = {"scoring": spec, "items": rows} | ({"packs": [{"id": p} for p in packs]} if packs else {})
    response = client.post("/v1/jobs", json=body)
    if response.status_code >= 400:  # e.g. an unknown pack: the service says which and what is loaded
        print(f"job refused ({response.status_code}): {response.json()['error']['message']}")
        return 1
    job = _follow(client, response.json())
    elapsed = time.perf_counter() - started
    if job["status"] != "succeeded":
        print(f"job {job['id']} ended {job['status']}: {job.get('error')}")
        return 1
    results = [orjson.loads(line) for line in client.get(f"/v1/jobs/{job['id']}/results").iter_lines() if line]
    print_summary(Console(), rows, spec, results, job, elapsed)
    return 0


def _follow(client: httpx.Client, job: dict) -> dict:
    with tqdm(total=job["progress"]["total"], unit="row", desc=f"scoring {job['id'][:16]}") as bar:
        while job["status"] in ("queued", "running"):
            time.sleep(0.25)
            job = client.get(f"/v1/jobs/{job['id']}").json()
            bar.update(job["progress"]["done"] - bar.n)
    return job


def _top(response: dict, query_id: str) -> tuple[str, float]:
    result = next(r for r in response["results"] if r["id"] == query_id)
    best = max(result["combinations"][0]["options"], key=lambda option: option["p"])
    return best["text"].strip(), best["p"]


def print_summary(console: Console, rows: list[dict], spec: dict, results: list[dict], job: dict, elapsed: float):
    scored = [row for row in results if "response" in row]
    query_ids = [query["id"] for query in spec["queries"]]
    console.print(f"\n[bold]{len(results)} rows[/bold]: {len(scored)} scored, {len(results) - len(scored)} errors,"
                  f" {elapsed:.1f}s ({len(results) / max(elapsed, 1e-9):.3g} rows/s) on {job['model']}")
    usage = job["usage"]
    console.print(f"tokens read: content {usage['content_tokens']}, questions {usage['question_tokens']},"
                  f" options {usage['option_tokens']}; floors computed {usage['floors_computed']},"
                  f" served from cache {usage['floors_cached']}\n")
    answers = Table(title="Most likely answer per question (rows, mean p)")
    answers.add_column("question")
    answers.add_column("answers")
    for query_id in query_ids:
        counts: dict[str, list[float]] = {}
        for row in scored:
            text, p = _top(row["response"], query_id)
            counts.setdefault(text, []).append(p)
        ranked = sorted(counts.items(), key=lambda item: -len(item[1]))
        answers.add_row(query_id, ", ".join(f"{text} {len(ps)} ({sum(ps) / len(ps):.2f})" for text, ps in ranked))
    console.print(answers)
    for pack_id, decisions in _pack_decisions(scored).items():
        console.print(f"Pack {pack_id}: decisions (rows)")
        table = Table()
        table.add_column("decision")
        table.add_column("labels")
        for decision_id, labels in decisions.items():
            ranked = sorted(((labels.count(label), label) for label in set(labels)), reverse=True)
            table.add_row(decision_id, ", ".join(f"{label} {count}" for count, label in ranked))
        console.print(table)
    texts = {row["custom_id"]: row.get("text") or row["messages"][-1]["content"] for row in rows}
    examples = Table(title=f"First {NUM_EXAMPLE_ROWS} rows")
    for column in ("custom_id", "message", *query_ids):
        examples.add_column(column, overflow="fold")
    for row in results[:NUM_EXAMPLE_ROWS]:
        message = texts.get(row["custom_id"], "").splitlines()[-1][:60]
        if "error" in row:
            examples.add_row(row["custom_id"], message, f"error: {row['error']['message']}")
            continue
        cells = [f"{text} {p:.2f}" for text, p in (_top(row["response"], q) for q in query_ids)]
        examples.add_row(row["custom_id"], message, *cells)
    console.print(examples)


def _pack_decisions(scored: list[dict]) -> dict[str, dict[str, list[str]]]:
    """{pack id: {decision id: [label per row]}} over the rows that named packs."""
    decisions: dict[str, dict[str, list[str]]] = {}
    for row in scored:
        for pack in row["response"].get("packs") or []:
            for decision_id, label in pack["decisions"].items():
                decisions.setdefault(pack["pack"], {}).setdefault(decision_id, []).append(label)
    return decisions
