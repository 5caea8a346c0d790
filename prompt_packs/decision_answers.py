"""Answers of a decisions request from its one ScoringResponse (prompt format decisions-v2).

    (DecisionCreate, DecisionPlan, ScoringResponse) --read_decision--> the Decision body (dict)
      predicate: probability = p(" yes")
      choice: probabilities per typed value (order-averaged over orderings), choice = argmax,
              confidence = the chosen value's probability
      score: probabilities per level (value = 0-based index), score = sum_i i * p_i (the
             expected level index), confidence = the most likely level's probability
      refusal: off-option mass > REFUSAL_ODDS x option mass (residual > 99 (1 - residual)), in
               any ordering: the model would mostly answer something that is not an option
      spinf: per answer the engine's raw p per option (per ordering), floor_p, residual, and
             `calibrated` (softmax(mean logprob / T)) for a question naming a fitted workload
"""

from __future__ import annotations

import math

from contract.decisions import ChoiceQuestion, DecisionCreate, PredicateQuestion
from contract.scoring_results import ScoringResponse
from prompt_packs.decision_format import PROMPT_FORMAT, REFUSAL_ODDS, DecisionPlan
from prompt_packs.orderings import Ordering, combine_orderings
from contract.probability import normalise


def is_refusal(residual: float) -> bool:
    """The options hold under 1 / (1 + REFUSAL_ODDS) of the mass (docs/decisions.md)."""
    return residual > REFUSAL_ODDS * (1.0 - residual)


def _answer(question, combos: list, orders: list[tuple[int, ...]], temperature: float | None) -> dict:
    orderings = [Ordering(str(k), order) for k, order in enumerate(orders)]
    combined = combine_orderings(orderings, [[o.p for o in c.options] for c in combos])
    probs = combined.probabilities
    logits = combine_orderings(orderings, [[o.logprob for o in c.options] for c in combos]).probabilities
    residual = max(c.residual for c in combos)
    spinf = {"options": [[o.text for o in c.options] for c in combos][0],
             "p": [[o.p for o in c.options] for c in combos],
             "floor_p": [[o.floor_p for o in c.options] for c in combos],
             "residual": [c.residual for c in combos], "calibrated": None}
    if temperature is not None:
        spinf["calibrated"] = {"temperature": temperature, "probabilities": normalise([z / temperature for z in logits])}
    base = {"name": question.name}
    if is_refusal(residual):
        return {**base, "type": "refusal", "spinf": spinf}
    if isinstance(question, PredicateQuestion):
        return {**base, "type": "predicate", "probability": probs[0], "spinf": spinf}
    if isinstance(question, ChoiceQuestion):
        values = [c.value for c in question.choices]
        return {**base, "type": "choice", "choice": values[combined.top], "confidence": probs[combined.top],
                "probabilities": [{"value": v, "probability": p} for v, p in zip(values, probs, strict=True)],
                "spinf": spinf}
    levels = question.levels
    return {**base, "type": "score", "score": math.fsum(i * p for i, p in enumerate(probs)),
            "confidence": max(probs),
            "probabilities": [{"label": lv.label, "value": i, "probability": p}
                              for i, (lv, p) in enumerate(zip(levels, probs, strict=True))],
            "spinf": spinf}


def read_decision(create: DecisionCreate, plan: DecisionPlan, response: ScoringResponse,
                  workloads: dict[str, float | None]) -> dict:
    by_id = {r.id: r.combinations[0] for r in response.results}
    answers = [_answer(q, [by_id[i] for i in ids], orders, workloads.get(q.workload) if q.workload else None)
               for q, ids, orders in zip(create.questions, plan.query_ids, plan.orders, strict=True)]
    usage = response.usage
    num_input = usage.content_tokens + usage.question_tokens + usage.option_tokens
    return {"object": "decision", "answers": answers, "model": response.model,
            "usage": {"input_tokens": num_input,
                      "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                      "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": num_input},
            "system_fingerprint": f"{response.system_fingerprint}+{PROMPT_FORMAT}", "prompt_format": PROMPT_FORMAT}
