"""Candidate selection: whole-vocabulary rows -> each live hypothesis's few candidates.

    log-probs [rows, V] on the model's device + RowNeed per row --select--> Candidates per row on the host

`select` is the only code that touches whole-vocabulary rows, and it runs where the rows are
(the GPU after a decoding pass): it masks, takes each row's top k + 1 (k <= beam width) and
the END log-mass, and returns only those to the host. A row's k best tokens are ranked by
log-probability, ties by token id (as `argmax` and the beam's ranking do); a tie across the
k-th place falls back to an exact pass over that row. The decoders (engine/extraction/decoder.py)
say what each row needs and read the answers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from engine.extraction.slots import MONEY_SLOT, NUMBER_SLOT, SlotVocab
from engine.layers.ops import SCORE_CHUNK

ALL = "all"  # RowNeed.tokens: every token (mode "generate")
TEXT = "text"  # every token but the special ones ({*}, mode "extract"); a grammar slot names its kind


@dataclass(slots=True)
class RowNeed:
    """What one live hypothesis needs from its next-token distribution."""

    k: int  # its k best tokens of `tokens` (0: none)
    tokens: str  # ALL | TEXT | NUMBER_SLOT | MONEY_SLOT (the grammar state's allowed tokens)
    allowed: torch.Tensor | None = None  # grammar: bool [G] over vocab.grammar_ids(kind) (CPU)
    end: bool = False  # grammar: the log of the mass of every token not allowed (END)
    full: bool = False  # the whole row, float64 on the host (sampling)
    gather: list[int] | None = None  # the log-probabilities of these tokens (ForcedDecoder)


@dataclass(slots=True)
class Candidates:
    """One row's answer to its RowNeed, on the host."""

    ids: list[int]  # at most k tokens, best first (log-prob desc, then id); -inf ones left out
    logprobs: list[float]  # float32 log-probabilities, as Python floats
    end: float | None = None  # log END mass (float64)
    full: torch.Tensor | None = None  # [V] float64
    gathered: dict[int, float] = field(default_factory=dict)  # RowNeed.gather's tokens -> their log-probs


def select(logprobs: torch.Tensor, needs: list[RowNeed | None], vocab: SlotVocab) -> list[Candidates | None]:
    """logprobs: [S, V] float32 log-softmax rows on any device; needs: one per row (None: a
    padding row). Whole-vocabulary work stays on logprobs' device; the host gets [rows, k + 1]
    values and ids, the END masses, and only the rows that asked for `full`."""
    device = logprobs.device
    tables = vocab.tables(device)
    out = [None if need is None else Candidates([], []) for need in needs]
    by_tokens: dict[str, list[int]] = {}
    for row, need in enumerate(needs):
        if need is not None and need.k > 0:
            by_tokens.setdefault(need.tokens, []).append(row)
    for tokens, rows in by_tokens.items():
        index = torch.tensor(rows, device=device)
        column_ids = None  # column -> token id (None: the column is the token)
        if tokens in (ALL, TEXT):
            values = logprobs.index_select(0, index)  # [n, V]
            if tokens == TEXT:
                values.index_fill_(1, tables.special, -math.inf)
        else:
            column_ids = tables.grammar[tokens]
            values = logprobs[index[:, None], column_ids[None, :]]  # [n, G]
            values.masked_fill_(~_allowed(needs, rows, device), -math.inf)
        _top(values, column_ids, [needs[row].k for row in rows], [out[row] for row in rows])
    for kind in (NUMBER_SLOT, MONEY_SLOT):
        rows = [row for row, need in enumerate(needs) if need is not None and need.end and need.tokens == kind]
        if rows:
            rest = logprobs.index_select(0, torch.tensor(rows, device=device)).double()  # [n, V]
            column_ids = tables.grammar[kind]
            allowed = _allowed(needs, rows, device)
            rest.index_copy_(1, column_ids, rest.index_select(1, column_ids).masked_fill_(allowed, -math.inf))
            for row, mass in zip(rows, _row_logsumexp(rest).tolist(), strict=True):
                out[row].end = mass
    rows = [row for row, need in enumerate(needs) if need is not None and need.full]
    if rows:
        full = logprobs.index_select(0, torch.tensor(rows, device=device)).double().cpu()
        for row, values in zip(rows, full, strict=True):
            out[row].full = values
    rows = [row for row, need in enumerate(needs) if need is not None and need.gather]
    if rows:
        row_index = torch.tensor([row for row in rows for _ in needs[row].gather], device=device)
        token_index = torch.tensor([token for row in rows for token in needs[row].gather], device=device)
        values = iter(logprobs[row_index, token_index].cpu().tolist())
        for row in rows:
            out[row].gathered = {token: next(values) for token in needs[row].gather}
    return out


def _allowed(needs: list[RowNeed | None], rows: list[int], device: torch.device) -> torch.Tensor:
    return torch.stack([needs[row].allowed for row in rows]).to(device)


def _top(values: torch.Tensor, column_ids: torch.Tensor | None, ks: list[int], outs: list[Candidates]) -> None:
    """values: [n, m] masked log-probs (-inf: not a candidate). Each row's k best, exactly."""
    num_top = min(max(ks) + 1, values.shape[1])  # one more than asked: a tie at the k-th place shows
    top_values, top_columns = values.topk(num_top, dim=1)
    top_ids = top_columns if column_ids is None else column_ids[top_columns]
    host_values, host_ids = top_values.cpu().tolist(), top_ids.cpu().tolist()
    for row, (k, out) in enumerate(zip(ks, outs, strict=True)):
        row_values, row_ids = host_values[row], host_ids[row]
        if k < num_top and row_values[k - 1] == row_values[k] > -math.inf:
            row_values, row_ids = _exact_top(values[row], column_ids, k, row_values[k - 1])
        best = sorted((-value, token) for value, token in zip(row_values[:k], row_ids[:k]) if value > -math.inf)
        out.ids = [token for _, token in best]
        out.logprobs = [-value for value, _ in best]


def _exact_top(row: torch.Tensor, column_ids: torch.Tensor | None, k: int, kth: float) -> tuple[list, list]:
    """The k best of one row when several columns tie at the k-th value: every column above
    it, then the tied ones in token order (columns are in token order)."""
    above = (row > kth).nonzero()[:, 0]
    tied = (row == kth).nonzero()[:, 0][: k - above.shape[0]]
    columns = torch.cat((above, tied))
    ids = columns if column_ids is None else column_ids[columns]
    return row[columns].tolist(), ids.tolist()


def _row_logsumexp(rows: torch.Tensor) -> torch.Tensor:
    """[n, V] float64 -> [n] logsumexp per row, each independent of the others: one row at a
    time on CPU; on CUDA on fixed SCORE_CHUNK-row blocks (the kernel's shape never changes)."""
    if rows.device.type == "cpu":
        return torch.stack([torch.logsumexp(row, 0) for row in rows]) if len(rows) else rows.new_empty(0)
    num_rows = rows.shape[0]
    padded = torch.zeros(-(-num_rows // SCORE_CHUNK) * SCORE_CHUNK, rows.shape[1], dtype=rows.dtype,
                         device=rows.device)
    padded[:num_rows] = rows
    blocks = [torch.logsumexp(padded[start : start + SCORE_CHUNK], 1) for start in range(0, len(padded), SCORE_CHUNK)]
    return torch.cat(blocks)[:num_rows].cpu()
