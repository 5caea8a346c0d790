"""Extraction slots for the benchmark workloads (issue 6, point 3: the GPU row is measured there).

    load_workload("news").requests(...) --with_slots(requests, load_slot_queries("news"))-->
        the same requests, each also asking the slot queries of fixtures/benchmarks/news-slots.json

The engine reads the slots' prompts in the same packed passes as the option queries, then
decodes them in later passes; `slot_token_share` turns the responses' usage into the cost
of the slots in scoring-token equivalents (tokens fed to the model for slots, per token
read for the option queries). Time the two phases apart with the runner's `run` / `decode`.
"""

from __future__ import annotations

import json

from benchmarks.workloads import FIXTURES


def load_slot_queries(name: str, num_slots: int | None = None) -> list[dict]:
    return json.loads((FIXTURES / f"{name}-slots.json").read_text())["queries"][:num_slots]


def with_slots(requests: list[dict], slot_queries: list[dict]) -> list[dict]:
    """Each request with the slot queries appended (ids must not clash with the workload's)."""
    return [r | {"scoring": {"queries": r["scoring"]["queries"] + slot_queries}} for r in requests]


def slot_token_share(responses) -> dict[str, float]:
    """Tokens the model read for option queries vs fed while decoding slots (prompts of the
    slots are read with the options: they are in `question_tokens`)."""
    read = sum(r.usage.content_tokens + r.usage.question_tokens + r.usage.option_tokens for r in responses)
    decoded = sum(r.usage.slot_tokens for r in responses)
    return {"read_tokens": read, "slot_tokens": decoded, "slot_tokens_per_read_token": decoded / max(1, read)}
