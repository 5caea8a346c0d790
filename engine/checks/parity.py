"""`spinf-jobs parity`: the engine against an independent transformers reference.

    cases (contents x queries) --Engine.score_requests--> engine numbers
    cases --transformers, one whole sequence per (content, query, option)--> reference numbers
    compare every logprob, p, floor_p and residual; last line: max_abs_logprob_diff=<x> items=<n>

The reference shares nothing with the engine but the checkpoint folder: transformers
loads the weights and the tokenizer, renders the chat template itself
(`continue_final_message` / `add_generation_prompt`), tokenizes every whole string and
reads log-probabilities from full causal forwards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import orjson
import torch

from contract.protocol import Query, ScoringRequest
from contract.scoring_results import ScoringResponse
from contract.templates import expand_grid

CASES_PATH = Path(__file__).resolve().parents[2] / "fixtures" / "parity" / "cases.json"
TOLERANCE = 1e-3


@dataclass(slots=True)
class ReferenceScores:
    logprobs: list[float]
    floor_logprobs: list[float]


class Reference:
    """transformers scoring each (content, query, option) as its own full sequence."""

    def __init__(self, folder: Path, batch_size: int = 8) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.has_chat_template = bool(self.tokenizer.chat_template)
        self.batch_size = batch_size
        self._cache: dict[tuple[tuple[int, ...], int], list[float]] = {}

    def render(self, messages: list[dict], answer_in: str) -> str:
        if not self.has_chat_template:
            return "\n\n".join(m["content"] for m in messages)
        if answer_in == "assistant":
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=not self.has_chat_template)["input_ids"]

    def option_logprobs(self, prompt: str, options: list[str]) -> list[float]:
        prompt_ids = self.encode(prompt)
        option_ids = [tuple(self.encode(prompt + option)) for option in options]
        branch = _common_prefix([prompt_ids, *option_ids])
        return [sum(lps) for lps in self.tail_logprobs([(ids, len(ids) - branch) for ids in option_ids])]

    def tail_logprobs(self, requests: list[tuple[tuple[int, ...], int]]) -> list[list[float]]:
        """Per (sequence, k): log P(token t | tokens < t) for its last k tokens."""
        missing = [r for r in dict.fromkeys(requests) if r not in self._cache]
        for start in range(0, len(missing), self.batch_size):
            self._run(missing[start : start + self.batch_size])
        return [self._cache[r] for r in requests]

    @torch.inference_mode()
    def _run(self, batch: list[tuple[tuple[int, ...], int]]) -> None:
        """Left-padded full forwards with explicit positions; logits only for the last columns."""
        length = max(len(sequence) for sequence, _ in batch)
        ids = torch.zeros(len(batch), length, dtype=torch.long)
        attention = torch.zeros(len(batch), length, dtype=torch.long)
        for row, (sequence, _) in enumerate(batch):
            ids[row, length - len(sequence) :] = torch.tensor(sequence)
            attention[row, length - len(sequence) :] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        num_kept = max(num_read for _, num_read in batch) + 1
        logits = self.model(
            input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=num_kept
        ).logits.float()  # [B, num_kept, V]: the last num_kept columns
        logprobs = torch.log_softmax(logits, dim=-1)
        for row, (sequence, num_read) in enumerate(batch):
            targets = torch.tensor(sequence[len(sequence) - num_read :])
            rows = logprobs[row, num_kept - 1 - num_read : num_kept - 1]
            self._cache[sequence, num_read] = rows.gather(1, targets[:, None])[:, 0].tolist()


def load_cases(has_chat_template: bool, num_contents: int | None = None) -> list[ScoringRequest]:
    cases = orjson.loads(CASES_PATH.read_bytes())
    queries = [q for q in cases["queries"] if has_chat_template or q.get("answer_in", "user") == "user"]
    contents = cases["contents"][:num_contents]
    return [
        ScoringRequest.model_validate(
            {"messages": [{"role": "user", "content": c}], "scoring": {"queries": queries}}
        )
        for c in contents
    ]


def reference_scores(reference: Reference, request: ScoringRequest, query: Query) -> list[ReferenceScores]:
    messages = [m.model_dump() for m in request.messages]
    floor_messages = [{**m, "content": ""} if m["role"] == "user" else m for m in messages]
    parsed = query.parsed_template
    scores = []
    for values in expand_grid(tuple(query.values), query.values):
        filled = parsed.fill(values)
        prompt = reference.render(messages, query.answer_in) + filled
        floor_prompt = reference.render(floor_messages, query.answer_in) + filled
        scores.append(
            ReferenceScores(
                reference.option_logprobs(prompt, query.options),
                reference.option_logprobs(floor_prompt, query.options),
            )
        )
    return scores


def compare(reference: Reference, request: ScoringRequest, response: ScoringResponse) -> list[dict]:
    """One row per (query, combination, option) with the engine's and the reference's numbers."""
    rows = []
    for query, result in zip(request.scoring.queries, response.results, strict=True):
        for expected, combination in zip(reference_scores(reference, request, query), result.combinations, strict=True):
            p = _normalise(expected.logprobs)
            floor_p = _normalise(expected.floor_logprobs)
            residual = max(0.0, 1.0 - sum(math.exp(lp) for lp in expected.logprobs))
            for index, option in enumerate(combination.options):
                rows.append(
                    {
                        "query": query.id,
                        "values": combination.values,
                        "option": option.text,
                        "logprob_diff": abs(option.logprob - expected.logprobs[index]),
                        "p_diff": abs(option.p - p[index]),
                        "floor_p_diff": abs(option.floor_p - floor_p[index]),
                        "residual_diff": abs(combination.residual - residual),
                    }
                )
    return rows


def run_parity(
    model: str, num_contents: int | None = None, leak_sibling: bool = False, max_num_batched_tokens: int = 4096
) -> list[dict]:
    """Score the cases with the engine and the reference; one comparison row per option."""
    from engine.engine import Engine, EngineConfig

    config = EngineConfig(model=model, device="cpu", dtype="float32", max_num_batched_tokens=max_num_batched_tokens)
    engine = Engine(config)
    if leak_sibling:
        engine.leak_sibling_for_negative_control()
    reference = Reference(engine.checkpoint_path)
    requests = load_cases(reference.has_chat_template, num_contents)
    output = engine.score_requests(requests)
    rows = []
    for request, response in zip(requests, output.results, strict=True):
        if not isinstance(response, ScoringResponse):
            raise RuntimeError(f"the engine refused a parity case: {response}")
        rows += compare(reference, request, response)
    return rows


def summarize(rows: list[dict]) -> tuple[float, float]:
    """(max |logprob diff|, max diff over logprob, p, floor_p and residual)."""
    max_logprob = max(r["logprob_diff"] for r in rows)
    worst = max(max(r["logprob_diff"], r["p_diff"], r["floor_p_diff"], r["residual_diff"]) for r in rows)
    return max_logprob, worst


def _normalise(logprobs: list[float]) -> list[float]:
    top = max(logprobs)
    weights = [math.exp(lp - top) for lp in logprobs]
    return [w / sum(weights) for w in weights]


def _common_prefix(sequences: list[list[int]]) -> int:
    length = 0
    for tokens in zip(*sequences):
        if any(t != tokens[0] for t in tokens):
            break
        length += 1
    return length
