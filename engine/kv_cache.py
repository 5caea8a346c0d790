"""Keys and values kept from the read, and attention for the decoding passes that reuse them.

    packed pass: tree_attention --KVCapture.save(layer, k, v)--> the K/V rows of each slot's
        prompt path (its ancestors in the tree: content, template up to the slot)
        --KVCapture.split--> SlotKV per slot (prompt rows; decoded rows are appended later)
    decoding pass: DecodeMetadata(spans: one per slot, its live hypotheses' new tokens)
        --decode_attention--> each new row attends to its slot's prompt rows, its own
        hypothesis's decoded rows and itself; the new rows' K/V are appended to the slot

So a content is read once: the slot's decoding steps never re-run its prompt. Each slot's
attention is its own SDPA over its own rows (batch invariance, as for the packed pass);
the rows of a slot sit at a multiple of SCORE_CHUNK in the decoding stream. CPU-first:
on CUDA the same code runs with torch SDPA (a fused kernel may replace `decode_attention`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.ops import to_device


@dataclass(slots=True)
class SlotKV:
    """One slot's keys and values per layer: the prompt path, then every decoded token."""

    keys: list[torch.Tensor]  # per layer [L, Hkv, d], after RoPE (and q/k norm)
    values: list[torch.Tensor]  # per layer [L, Hkv, d]
    positions: torch.Tensor  # [L] long RoPE position of each row
    num_prompt_rows: int  # rows 0..num_prompt_rows-1 are the prompt; every hypothesis sees them

    @property
    def num_rows(self) -> int:
        return int(self.positions.shape[0])


@dataclass(slots=True)
class KVCapture:
    """Set on a packed pass that holds slots: keeps their prompt paths' K/V, layer by layer."""

    rows: torch.Tensor  # [R] long stream rows of every slot's prompt path, slot after slot, root first
    lengths: list[int]  # rows per slot
    keys: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [R, Hkv, d]
    values: dict[int, torch.Tensor] = field(default_factory=dict)

    def save(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        rows = self.rows.to(k.device)
        self.keys[layer] = k.index_select(0, rows)
        self.values[layer] = v.index_select(0, rows)

    def split(self) -> list[SlotKV]:
        layers = sorted(self.keys)
        keys = [self.keys[i].split(self.lengths) for i in layers]
        values = [self.values[i].split(self.lengths) for i in layers]
        return [
            SlotKV([k[s] for k in keys], [v[s] for v in values], torch.arange(n), n)
            for s, n in enumerate(self.lengths)
        ]


@dataclass(slots=True)
class DecodeSpan:
    start: int  # first row in the decoding stream (a multiple of SCORE_CHUNK)
    num_rows: int  # rows of this slot, padded to SCORE_CHUNK
    num_real: int  # live hypotheses (rows past them are padding)
    kv: SlotKV
    mask: torch.Tensor  # [num_rows, L + num_rows] bool over (slot rows so far, then the new rows)
    key_positions: torch.Tensor  # [L + num_rows] long, for sliding windows
    positions: torch.Tensor  # [num_rows] long positions of the new rows
    _masks: dict = field(default_factory=dict, repr=False)  # (window, device) -> the mask there

    def attention_mask(self, sliding_window: int | None, device: torch.device) -> torch.Tensor:
        """`mask`, narrowed to keys less than `sliding_window` positions back, on `device`: made
        once per pass (not once per layer), copied without blocking the host on CUDA."""
        key = (sliding_window, device)
        if key not in self._masks:
            mask = self.mask
            if sliding_window is not None:
                mask = mask & (self.positions[:, None] - self.key_positions[None, :] < sliding_window)
            self._masks[key] = to_device(mask, device)
        return self._masks[key]


@dataclass(slots=True)
class DecodeMetadata:
    spans: list[DecodeSpan]  # one per slot in the pass


def decode_attention(
    q: torch.Tensor,  # [T, Hq, d]
    k: torch.Tensor,  # [T, Hkv, d]
    v: torch.Tensor,  # [T, Hkv, d]
    meta: DecodeMetadata,
    layer: int,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:  # [T, Hq, d]; rows outside every span are zero
    from engine.attention import sdpa

    out = torch.zeros_like(q)
    for span in meta.spans:
        rows = slice(span.start, span.start + span.num_rows)
        keys = torch.cat((span.kv.keys[layer], k[rows]))
        values = torch.cat((span.kv.values[layer], v[rows]))
        mask = span.attention_mask(sliding_window, q.device)
        out[rows] = sdpa(q[rows], keys, values, mask, scale)
        # the live rows' K/V join the slot: a view of what was just attended over (no second copy)
        num_kept = span.kv.keys[layer].shape[0] + span.num_real
        span.kv.keys[layer], span.kv.values[layer] = keys[:num_kept], values[:num_kept]
    return out


def decode_mask(kv: SlotKV, hypothesis_rows: list[list[int]], num_rows: int) -> torch.Tensor:
    """[num_rows, L + num_rows]: a live hypothesis sees the prompt, its own decoded rows and
    itself; a padding row only itself."""
    num_kept = kv.num_rows
    mask = torch.zeros(num_rows, num_kept + num_rows, dtype=torch.bool)
    for row, own in enumerate(hypothesis_rows):
        mask[row, : kv.num_prompt_rows] = True
        mask[row, own] = True
    index = torch.arange(num_rows)
    mask[index, num_kept + index] = True
    return mask
