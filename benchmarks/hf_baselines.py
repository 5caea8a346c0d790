"""Two of the three transformers baselines, on exactly the items spinf scores.

    engine.compile(request) --items_from_engine--> Item(trunk, questions, option tokens)
    hf_naive:  every (content, question) its own sequence, padded batches, logits at the last token
    hf_prefix: the content's KV once, then all its questions in ONE batched forward over the
               shared cache (questions right-padded), logits at each question's last token
    (hf_prefix_batched, G contents per forward: benchmarks/prefix_batched.py)

Both run eager transformers with SDPA in bf16 and apply the LM head only at the scored rows.
The options are single tokens (" yes" / " no"), so one position per question is scored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NAIVE_BATCH = 32  # sequences per padded forward


@dataclass(slots=True)
class Item:
    trunk: list[int]  # the content's tokens shared by every question
    questions: list[list[int]]  # per question: its tokens after the trunk, up to the branch point
    options: list[list[int]]  # per question: the token of each option after the branch point


def items_from_engine(engine, requests) -> list[Item]:
    items = []
    for request in requests:
        compiled = engine.compile(request)
        prompts, options = [], []
        for branch in compiled.branches:
            if any(len(ids) != branch.branch_point + 1 for ids in branch.option_ids):
                raise ValueError("the baselines score single-token options only")
            prompts.append(branch.option_ids[0][: branch.branch_point])
            options.append([ids[branch.branch_point] for ids in branch.option_ids])
        trunk_len = common_prefix_len(prompts)
        items.append(Item(prompts[0][:trunk_len], [p[trunk_len:] for p in prompts], options))
    return items


def common_prefix_len(seqs: list[list[int]]) -> int:
    length = min(len(s) for s in seqs) - 1  # keep at least one token per question
    for i in range(length):
        if any(s[i] != seqs[0][i] for s in seqs):
            return i
    return length


def _logprobs(hf, hidden: torch.Tensor, options: torch.Tensor) -> torch.Tensor:
    """hidden [B, D] at the scored rows -> [B, num_options] fp32 log-probabilities."""
    logits = hf.lm_head(hidden).float()
    cap = getattr(hf.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return torch.log_softmax(logits, dim=-1).gather(1, options)


def _repeat_cache(cache, times: int):
    if hasattr(cache, "batch_repeat_interleave"):
        cache.batch_repeat_interleave(times)
        return cache
    for layer in cache.layers:  # transformers 5 DynamicCache layers
        layer.keys = layer.keys.repeat_interleave(times, dim=0)
        layer.values = layer.values.repeat_interleave(times, dim=0)
    return cache


@torch.inference_mode()
def prefix_pass(hf, items: list[Item]) -> tuple[list[torch.Tensor], int]:
    out, num_tokens = [], 0
    for item in items:
        trunk = torch.tensor(item.trunk, device=hf.device)[None]
        cache = hf.model(input_ids=trunk, use_cache=True).past_key_values
        lengths = torch.tensor([len(q) for q in item.questions], device=hf.device)
        width, num_q = int(lengths.max()), len(item.questions)
        ids = torch.zeros(num_q, width, dtype=torch.long, device=hf.device)
        mask = torch.zeros(num_q, len(item.trunk) + width, dtype=torch.long, device=hf.device)
        mask[:, : len(item.trunk)] = 1
        for row, question in enumerate(item.questions):
            ids[row, : len(question)] = torch.tensor(question)
            mask[row, len(item.trunk) : len(item.trunk) + len(question)] = 1
        positions = (len(item.trunk) + torch.arange(width, device=hf.device)).expand(num_q, width)
        hidden = hf.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                          past_key_values=_repeat_cache(cache, num_q), use_cache=True).last_hidden_state
        last = hidden[torch.arange(num_q, device=hf.device), lengths - 1]  # [Q, D]
        out.append(_logprobs(hf, last, torch.tensor(item.options, device=hf.device)).flatten())
        num_tokens += len(item.trunk) + int(lengths.sum())
    return out, num_tokens


@torch.inference_mode()
def naive_pass(hf, items: list[Item]) -> tuple[list[torch.Tensor], int]:
    seqs = [(item.trunk + q, opts) for item in items for q, opts in zip(item.questions, item.options, strict=True)]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))
    results: list[torch.Tensor | None] = [None] * len(seqs)
    for start in range(0, len(order), NAIVE_BATCH):
        chunk = order[start : start + NAIVE_BATCH]
        width = max(len(seqs[i][0]) for i in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for row, i in enumerate(chunk):
            ids[row, : len(seqs[i][0])] = torch.tensor(seqs[i][0])
            mask[row, : len(seqs[i][0])] = 1
        lengths = mask.sum(1).to(hf.device)
        hidden = hf.model(input_ids=ids.to(hf.device), attention_mask=mask.to(hf.device)).last_hidden_state
        last = hidden[torch.arange(len(chunk), device=hf.device), lengths - 1]
        lp = _logprobs(hf, last, torch.tensor([seqs[i][1] for i in chunk], device=hf.device))
        for row, i in enumerate(chunk):
            results[i] = lp[row]
    return results, sum(len(s[0]) for s in seqs)


def run_prefix(hf, items, repeats: int, timed):
    seconds, times, (out, num_tokens) = timed(lambda: prefix_pass(hf, items), repeats)
    return {"seconds": seconds, "times": times, "tokens": num_tokens}, [t.tolist() for t in out]


def run_naive(hf, items, repeats: int, timed):
    seconds, times, (out, num_tokens) = timed(lambda: naive_pass(hf, items), repeats)
    return {"seconds": seconds, "times": times, "tokens": num_tokens}, out
