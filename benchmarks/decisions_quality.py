"""The support-queue question through /v1/decisions and through /v1/decide, on fixtures/labelled/support.jsonl.

    row text --"Customer support message:\\n" + text--> the input / the state
      /v1/decisions: {choice "queue" (5 queues, value + description), predicate "refund"}
                     -> decision_request -> engine -> read_decision
      /v1/decide:    {question, options [{id, description "Billing (charges, ...)"}]}
                     -> scoring_request -> engine -> read_decision (api/decisions.py)
    -> accuracy of each on the rows' queue label, the decisions answers' residuals and the
       refusal rate of the rule (prompt_packs/decision_answers.is_refusal) beside naive
       absolute thresholds, and the README's support message's answers

Both sides go through the routes' own translators on one in-process engine (the routes add
only the sync queue, which moves no float: tests/api/test_decisions.py checks /v1/decisions
against /v1/score bit for bit). `python3 benchmarks/decisions_quality.py [--model NAME]`
writes benchmarks/results/decisions-quality-<model>-support.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api.decisions import DecideRequest, read_decision as read_decide, scoring_request  # noqa: E402
from contract.decisions import DecisionCreate  # noqa: E402
from contract.scoring_results import ScoringResponse  # noqa: E402
from prompt_packs.decision_answers import is_refusal, read_decision  # noqa: E402
from prompt_packs.decision_format import decision_request  # noqa: E402

SUPPORT = ROOT / "fixtures" / "labelled" / "support.jsonl"
FRAME = "Customer support message:\n"
README_MESSAGE = "I was charged twice for September, please refund one of the charges."
QUESTION = "Which team should handle this message?"
QUEUES = {  # the spinf/support-triage pack's topic choices
    "billing": "charges, invoices, refunds, payment methods",
    "technical": "bugs, errors, crashes, setup, performance",
    "account": "login, password, profile, security, access",
    "shipping": "delivery, tracking, lost or damaged parcels, returns",
    "cancellation": "ending a subscription or closing the service",
}
REFUND = "Is the customer asking for a refund?"
NAIVE_RESIDUALS = (0.5, 0.9)  # absolute thresholds shown beside the rule: refuse when residual > t


def decisions_body(model: str, text: str) -> dict:
    return {"model": model, "input": FRAME + text, "questions": [
        {"type": "choice", "name": "queue", "instructions": QUESTION,
         "choices": [{"value": q, "description": d} for q, d in QUEUES.items()]},
        {"type": "predicate", "name": "refund", "instructions": REFUND}]}


def decide_body(model: str, text: str) -> DecideRequest:
    options = [{"id": q, "description": f"{q.capitalize()} ({d})"} for q, d in QUEUES.items()]
    return DecideRequest.model_validate({"model": model, "state": FRAME + text, "question": QUESTION,
                                         "options": options})


def ask(engine, texts: list[str], chunk: int = 16) -> list[tuple[dict, dict]]:
    """(decision body, decide result) per text, both sides of a chunk scored in one batch."""
    out = []
    for start in range(0, len(texts), chunk):
        part = texts[start : start + chunk]
        creates = [DecisionCreate.model_validate(decisions_body(engine.model_name, t)) for t in part]
        plans = [decision_request(c, {}) for c in creates]
        decides = [decide_body(engine.model_name, t) for t in part]
        requests = [p.request for p in plans] + [scoring_request(d.model, d.state, ["decision"], [d]) for d in decides]
        results = engine.score_requests(requests).results
        for i, (create, plan, decide) in enumerate(zip(creates, plans, decides, strict=True)):
            body = read_decision(create, plan, ScoringResponse.model_validate(results[i]), {})
            decided = read_decide("decision", decide, results[len(part) + i].model_dump(mode="json"), {})
            out.append((body, decided))
    return out


def summarise(rows: list[dict], answered: list[tuple[dict, dict]]) -> dict:
    queue = [body["answers"][0] for body, _ in answered]
    refund = [body["answers"][1] for body, _ in answered]
    labels = [row["labels"][0] for row in rows]
    chosen = [a.get("choice") for a in queue]
    residuals = {"queue": [max(a["spinf"]["residual"]) for a in queue],
                 "refund": [max(a["spinf"]["residual"]) for a in refund]}
    refusals = {name: {"rule": sum(map(is_refusal, values)) / len(values),
                       **{f"residual>{t}": sum(r > t for r in values) / len(values) for t in NAIVE_RESIDUALS}}
                for name, values in residuals.items()}
    # accuracy of the option the probabilities favour (a refused answer is scored by its raw p)
    top = [max(zip(a["spinf"]["p"][0], QUEUES), key=lambda pq: pq[0])[1] for a in queue]
    return {
        "num_rows": len(rows),
        "decisions_accuracy": sum(t == y for t, y in zip(top, labels)) / len(rows),
        "decisions_answered_accuracy": sum(c == y for c, y in zip(chosen, labels)) / len(rows),
        "decide_accuracy": sum(d["top"] == y for (_, d), y in zip(answered, labels)) / len(rows),
        "refusal_rate": refusals,
        "residual_median": {k: sorted(v)[len(v) // 2] for k, v in residuals.items()},
        "residual_max": {k: max(v) for k, v in residuals.items()},
    }


def main() -> None:
    from benchmarks.result_files import new_result, write_json
    from contract.settings import DEFAULT_MODEL
    from engine.engine import Engine, EngineConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--limit", type=int, default=0, help="first N rows only (0: all)")
    args = parser.parse_args()
    rows = [json.loads(line) for line in SUPPORT.read_text().splitlines() if line.strip()]
    rows = rows[: args.limit] if args.limit else rows
    engine = Engine(EngineConfig(model=args.model, device="cpu"))
    started = time.perf_counter()
    answered = ask(engine, [row["text"] for row in rows])
    [(readme, readme_decide)] = ask(engine, [README_MESSAGE])
    result = new_result(model=engine.model_name, system_fingerprint=engine.system_fingerprint,
                        prompt_format=readme["prompt_format"], data=str(SUPPORT.relative_to(ROOT)),
                        **summarise(rows, answered), seconds=round(time.perf_counter() - started, 1),
                        readme={"queue": readme["answers"][0], "refund": readme["answers"][1],
                                "decide_top": readme_decide["top"]})
    print(json.dumps({k: v for k, v in result.items() if k != "readme"}, indent=1))
    print(json.dumps(result["readme"]["refund"]), result["readme"]["queue"].get("choice"))
    write_json(result, "decisions-quality", engine.model_name, "support")


if __name__ == "__main__":
    main()
