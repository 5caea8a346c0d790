"""hf_prefix_batched: the transformers prefix baseline with G contents per forward, and its sweep.

    items --groups of G contents--> one forward of the G trunks, LEFT-padded, position ids
        counted from each trunk's first real token --> a DynamicCache, per layer [G, kv heads, W, d]
    the group's question rows, content after content --chunks of C rows--> per chunk a
        DynamicCache whose row r holds the trunk K/V of row r's content (an expanded view when
        the chunk reads one content, gathered rows otherwise) --> one forward of the chunk's
        questions, right-padded; mask = the trunk's padding, then the question's tokens; position
        ids continue each trunk --> hidden state at each question's last token --> LM head there
        --> option log-probs (hf_baselines._logprobs)
    sweep(hf, items, chunks, groups, repeats, timed) -> a row per (C, G): its timings, or "oom"

Left padding: transformers masks by cache index (causal, and Gemma's sliding window as
kv_idx > q_idx - window), so left-padded trunks keep every real key's cache distance to a
question equal to its position distance; right padding would put pads between a trunk and
its questions. The trunk cache is a plain DynamicCache() (every layer keeps all W tokens; the
sliding layers' window comes from the mask alone).

Chunks: DynamicLayer.update concatenates a layer's cached K/V with the new tokens' (torch.cat),
so a question forward holds rows x (W + question width) K/V in every layer until it ends
(384 KiB per token on Gemma-3-12B) whatever the cache held before: a view saves the gather's
copy, not that. The chunk C bounds this part of the peak, the group G the trunk's part.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

import torch
from hf_baselines import Item, _logprobs


def group_sizes(num_items: int) -> list[int]:
    """1, 2, 4, ... below num_items, then num_items (one group of every content)."""
    sizes, size = [], 1
    while size < num_items:
        sizes.append(size)
        size *= 2
    return [*sizes, num_items]


@torch.inference_mode()
def prefix_batched_pass(hf, items: list[Item], group: int, chunk: int) -> tuple[list[torch.Tensor], int]:
    """Per item its option log-probs, flat in (question, option) order as hf_prefix's; and the
    non-padding tokens read. chunk: question rows per forward (0: all of a group's rows)."""
    out = []
    for start in range(0, len(items), group):
        out += _score_group(hf, items[start : start + group], chunk)
    return out, sum(len(i.trunk) + sum(map(len, i.questions)) for i in items)


def _score_group(hf, items: list[Item], chunk: int) -> list[torch.Tensor]:
    from transformers import DynamicCache

    trunk_cache, trunk_mask = _trunk_forward(hf, [item.trunk for item in items], DynamicCache())
    rows = [(index, question, options) for index, item in enumerate(items)
            for question, options in zip(item.questions, item.options, strict=True)]
    step = chunk or len(rows)
    scored = [_score_rows(hf, items, rows[start : start + step], trunk_cache, trunk_mask)
              for start in range(0, len(rows), step)]
    del trunk_cache
    logprobs, valid = torch.cat([lp for lp, _ in scored]), torch.cat([v for _, v in scored])
    out, start = [], 0
    for item in items:
        end = start + len(item.questions)
        out.append(logprobs[start:end][valid[start:end]])  # row-major: question, then option
        start = end
    return out


def _trunk_forward(hf, trunks: list[list[int]], cache) -> tuple[object, torch.Tensor]:
    """The trunks in one forward, left-padded to the longest: (the filled cache, mask [G, W])."""
    width = max(map(len, trunks))
    ids = torch.zeros(len(trunks), width, dtype=torch.long)
    mask = torch.zeros(len(trunks), width, dtype=torch.long)
    positions = torch.zeros(len(trunks), width, dtype=torch.long)
    for row, trunk in enumerate(trunks):
        pad = width - len(trunk)
        ids[row, pad:] = torch.tensor(trunk)
        mask[row, pad:] = 1
        positions[row, pad:] = torch.arange(len(trunk))
    mask = mask.to(hf.device)
    hf.model(input_ids=ids.to(hf.device), attention_mask=mask, position_ids=positions.to(hf.device),
             past_key_values=cache, use_cache=True)
    return cache, mask


def _score_rows(hf, items: list[Item], rows: list[tuple], trunk_cache, trunk_mask: torch.Tensor):
    """One forward of question rows [(item index, question tokens, option tokens)] over their
    trunks' cache: ([rows, most options] log-probs, [rows, most options] which are real)."""
    device, width = hf.device, max(len(q) for _, q, _ in rows)
    num_options = max(len(o) for _, _, o in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    question_mask = torch.zeros(len(rows), width, dtype=torch.long)
    options = torch.zeros(len(rows), num_options, dtype=torch.long)
    valid = torch.zeros(len(rows), num_options, dtype=torch.bool)
    for row, (_, question, opts) in enumerate(rows):
        ids[row, : len(question)] = torch.tensor(question)
        question_mask[row, : len(question)] = 1
        options[row, : len(opts)] = torch.tensor(opts)
        valid[row, : len(opts)] = True
    contents = [index for index, _, _ in rows]
    starts = torch.tensor([len(items[i].trunk) for i in contents])  # each question's first position
    positions = starts[:, None] + torch.arange(width)
    content_rows = torch.tensor(contents, device=device)
    mask = torch.cat([trunk_mask.index_select(0, content_rows), question_mask.to(device)], dim=1)
    cache = _rows_cache(trunk_cache, contents, content_rows)
    hidden = hf.model(input_ids=ids.to(device), attention_mask=mask, position_ids=positions.to(device),
                      past_key_values=cache, use_cache=True).last_hidden_state
    del cache
    lengths = question_mask.sum(1).to(device)
    last = hidden[torch.arange(len(rows), device=device), lengths - 1]
    return _logprobs(hf, last, options.to(device)), valid.to(device)


def _rows_cache(trunk_cache, contents: list[int], content_rows: torch.Tensor):
    """A DynamicCache whose row r holds the trunk K/V of content contents[r]: an expanded view
    of one content's rows when every row reads the same content (nothing is copied before the
    forward's own torch.cat), else the rows gathered (one copy)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    one = contents[0] if all(c == contents[0] for c in contents) else None

    def rows_of(tensor: torch.Tensor) -> torch.Tensor:
        if one is not None:
            return tensor[one : one + 1].expand(len(contents), -1, -1, -1)
        return tensor.index_select(0, content_rows)

    cache = DynamicCache()
    for trunk_layer in trunk_cache.layers:
        layer = DynamicLayer()
        keys, values = rows_of(trunk_layer.keys), rows_of(trunk_layer.values)
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        cache.layers.append(layer)
    return cache


def sweep(hf, items: list[Item], chunks: list[int], groups: list[int], repeats: int, timed: Callable,
          memory: Callable[[], float | None], on_point: Callable[[list[dict]], None] = lambda rows: None,
          ) -> tuple[list[dict], list[list[float]] | None]:
    """For each chunk, each group size in increasing order until one runs out of memory (then
    "oom" and the larger ones are not tried): {chunk, group, seconds, times, tokens,
    peak_gpu_gib, finite} or {chunk, group, oom: True}; and the log-probs of the fastest point
    whose log-probs are all finite.
    memory(): the peak since the last call (resetting it), None where not measured;
    on_point(rows so far): after every point (a run cut short keeps them)."""
    rows, best, best_logprobs = [], None, None
    for chunk in chunks:
        for group in groups:
            _free_memory()
            memory()
            try:
                seconds, times, (out, tokens) = timed(lambda g=group, c=chunk: prefix_batched_pass(hf, items, g, c), repeats)
            except torch.cuda.OutOfMemoryError:
                out = None
            _free_memory()  # a failed forward's tensors go with its traceback
            if out is None:
                rows.append({"chunk": chunk, "group": group, "oom": True})
            else:
                finite = bool(torch.isfinite(torch.cat(out)).all())  # a NaN would void the point
                rows.append({"chunk": chunk, "group": group, "seconds": seconds, "times": times, "tokens": tokens,
                             "peak_gpu_gib": memory(), "finite": finite})
                if finite and (best is None or seconds < best["seconds"]):
                    best, best_logprobs = rows[-1], [t.tolist() for t in out]
                del out
            print("hf_prefix_batched", {k: v for k, v in rows[-1].items() if k != "times"}, flush=True)
            on_point(rows)
            if rows[-1].get("oom"):
                break
    return rows, best_logprobs


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
