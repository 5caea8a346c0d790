"""How time grows with questions per content (8, 32, 128) and content length (128 ... 4,096).

    run_sweeps(engine, hf, workload, timed) -> rows {sweep, value, spinf_s, hf_prefix_s, tokens}

Each point scores NUM_CONTENTS contents (seconds are per content) with spinf_bf16 and with
hf_prefix, median of 3 timed repeats after a warm-up. Questions beyond the fixture's 56 are
the same questions with a numbered prefix (distinct token sequences, same lengths).
Long contents are the workload's texts concatenated and cut at a token count.
"""

from __future__ import annotations

import hf_baselines

from contract.protocol import ScoringRequest

NUM_CONTENTS = 4
QUESTION_COUNTS = (8, 32, 128)
CONTENT_LENGTHS = (128, 512, 1024, 2048, 4096)
SWEEP_REPEATS = 3


def numbered_queries(queries: list[dict], count: int) -> list[dict]:
    out = []
    for i in range(count):
        base = queries[i % len(queries)]
        template = base["template"] if i < len(queries) else f"\n\n({i // len(queries)}){base['template']}"
        out.append({**base, "id": f"s{i:03d}", "template": template})
    return out


def contents_of_length(engine, workload, num_tokens: int) -> list[str]:
    text = "\n\n".join(workload.texts)
    ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
    step = max(1, (len(ids) - num_tokens) // NUM_CONTENTS)
    return [engine.tokenizer.decode(ids[i * step : i * step + num_tokens]) for i in range(NUM_CONTENTS)]


def measure(engine, hf, contents: list[str], queries: list[dict], timed) -> dict:
    requests = [
        ScoringRequest.model_validate({"model": engine.model_name, "messages": [{"role": "user", "content": c}],
                                       "scoring": {"queries": queries}})
        for c in contents
    ]
    items = hf_baselines.items_from_engine(engine, requests)
    engine.score_requests(requests)  # fills the floor cache
    spinf_s, _, _ = timed(lambda: engine.score_requests(requests), SWEEP_REPEATS)
    prefix_s, _, _ = timed(lambda: hf_baselines.prefix_pass(hf, items), SWEEP_REPEATS)
    tokens = sum(len(i.trunk) + sum(map(len, i.questions)) for i in items) // len(items)
    return {"spinf_s": spinf_s / len(contents), "hf_prefix_s": prefix_s / len(contents), "tokens": tokens}


def run_sweeps(engine, hf, workload, timed) -> list[dict]:
    rows = []
    contents = workload.texts[:NUM_CONTENTS]
    contents = [workload.message_template.format(article=c, message=c) for c in contents]
    for count in QUESTION_COUNTS:
        row = measure(engine, hf, contents, numbered_queries(workload.queries, count), timed)
        rows.append({"sweep": "questions_per_content", "value": count, **row})
        print(rows[-1], flush=True)
    for length in CONTENT_LENGTHS:
        row = measure(engine, hf, contents_of_length(engine, workload, length), workload.queries[:8], timed)
        rows.append({"sweep": "content_tokens", "value": length, **row})
        print(rows[-1], flush=True)
    return rows
