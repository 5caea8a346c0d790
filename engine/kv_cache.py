"""Keys and values kept from the read, and attention for the decoding passes that reuse them.

    packed pass: tree_attention --KVCapture.save(layer, k, v)--> the K/V rows of each slot's
        prompt path (its ancestors in the tree: content, template up to the slot)
        --KVCapture.split--> SlotKV per slot (prompt rows, views of the capture)
    decoding pass (engine/extraction.prepare_decode_batch):
        KVStore.reserve: each slot gets an entry of the KVArena of its capacity (a slot's
            rows are copied only when it enters an arena: from the capture, or from a smaller
            arena once it outgrows it)
        DecodeSpan per slot (its live hypotheses' new tokens) --group_spans--> DecodeGroup per
            (arena, rows per slot): host index tensors and masks, built once per pass
        decode_attention, per layer and group: the new rows' K/V are written into their slots'
            entries in place, then ONE SDPA over the group's entries [B, Hkv, C, d]

So a content is read once, a slot's rows are never re-copied per step, and a pass runs one
SDPA per layer for each (capacity, rows) pair present (a few, not one per slot).

Batch invariance (a slot's answers do not depend on what is decoded beside it):
- A slot's attention problem has shapes that depend only on that slot: n query rows (its live
  hypotheses padded to SCORE_CHUNK; with GQA its Hq/Hkv query heads folded into G·n rows of
  one kv head, no K/V copy) against C keys, the padding keys masked. C = capacity_for(its
  rows + its decoder's most rows) when it enters, capacity_for(its rows + n) if it outgrows
  that: its own numbers only, never the longest slot of the pass.
- SDPA computes each batch entry on its own: the same kernel, the same shapes, whatever the
  batch size or the entry's place in it (CPU: the flash kernel splits work by (entry, head,
  query block); CUDA: the memory-efficient kernel's grid is (query block, head, entry), no
  split over keys). `tests/engine/test_extraction_invariance.py` checks answers alone vs.
  batched bit for bit on CPU; `tests/engine/test_gpu_slots.py` on CUDA.
- Keys past a slot's written rows are zeros or stale rows (its own, or those of the entry's
  earlier owner): finite, so masked keys add exactly nothing (score -inf, weight 0, 0 · v = 0). Entries of the range not in this pass (finished or
  decoded in another pass) get a dummy query and are discarded.
Padding a slot's keys from L + n to C changes SDPA's reduction against the per-slot SDPA of
before (tests/engine/test_extraction_reference.py: equal answers, |Δp| ≤ 1e-5).

CUDA: the index tensors and masks reach the device once per pass through `ops.to_device`
(pinned, non-blocking); decode_attention does no host sync (no .item(), no .tolist()).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.ops import to_device

MIN_CAPACITY = 64  # key rows of the smallest arena; capacities 64, 96, 128, 192, 256, 384, ...


def capacity_for(num_rows: int) -> int:
    """The key capacity of a slot needing `num_rows` rows (at most 1.5x them, a multiple of 32):
    it depends on that number only."""
    capacity = MIN_CAPACITY
    while capacity < num_rows:
        capacity = capacity * 3 // 2 if capacity & (capacity - 1) == 0 else capacity * 4 // 3
    return capacity


@dataclass(slots=True, eq=False)
class SlotKV:
    """One slot's keys and values: the prompt path, then every decoded token."""

    keys: list[torch.Tensor]  # per layer [P, Hkv, d] prompt K/V as captured; [] once in an arena
    values: list[torch.Tensor]  # per layer [P, Hkv, d]
    positions: torch.Tensor  # [L] long (host) RoPE position of each kept row
    num_prompt_rows: int  # rows 0..num_prompt_rows-1 are the prompt; every hypothesis sees them
    arena: KVArena | None = None  # where its rows live while it is decoded
    entry: int = -1  # its entry in `arena`

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


@dataclass(slots=True, eq=False)
class KVArena:
    """The K/V of every slot whose rows fit `capacity`: entry e's row r sits at [e, r]."""

    capacity: int  # C key rows per entry
    keys: list[torch.Tensor]  # per layer [E, C, Hkv, d]; zeros where nothing was written
    values: list[torch.Tensor]  # per layer [E, C, Hkv, d]
    owners: list[SlotKV | None] = field(default_factory=list)  # [E] entry -> its slot (None: free)

    @classmethod
    def like(cls, capacity: int, kv: SlotKV) -> KVArena:
        """An arena with no entries, its layers shaped as the slot's."""
        def empty(row: torch.Tensor) -> torch.Tensor:  # row [Hkv, d] -> [0, C, Hkv, d]
            return row.new_zeros((0, capacity) + row.shape)

        layers = range(_num_layers(kv))
        return cls(capacity, [empty(_kept(kv, "keys", i, 1)[0]) for i in layers],
                   [empty(_kept(kv, "values", i, 1)[0]) for i in layers])

    def add(self, kvs: list[SlotKV]) -> None:
        """Move the slots in: one copy of each one's kept rows per layer; their old entries free."""
        free = [e for e, owner in enumerate(self.owners) if owner is None]
        if len(free) < len(kvs):
            free += self._grow(len(kvs) - len(free))
        entries = free[: len(kvs)]
        dest = torch.cat([e * self.capacity + torch.arange(kv.num_rows) for e, kv in zip(entries, kvs)])
        dest = to_device(dest, self.keys[0].device)  # [sum of kept rows] flat rows of the arena
        for layer in range(len(self.keys)):
            for part in ("keys", "values"):
                rows = torch.cat([_kept(kv, part, layer, kv.num_rows) for kv in kvs])  # [sum rows, Hkv, d]
                getattr(self, part)[layer].view(-1, *rows.shape[1:]).index_copy_(0, dest, rows)
        for entry, kv in zip(entries, kvs):
            KVStore.release(kv)  # its entry in a smaller arena
            kv.arena, kv.entry, kv.keys, kv.values = self, entry, [], []
            self.owners[entry] = kv

    def _grow(self, num_missing: int) -> list[int]:
        """At least `num_missing` new entries, at least doubling the arena: each growth copies
        every layer's keys and values, so growing by what is missing alone would copy the
        arena again for every pass that brings slots in."""
        first = len(self.owners)
        extra = max(num_missing, first)
        for tensors in (self.keys, self.values):
            for layer, old in enumerate(tensors):
                tensors[layer] = torch.cat((old, old.new_zeros((extra,) + old.shape[1:])))
        self.owners += [None] * extra
        return list(range(first, first + extra))


def _num_layers(kv: SlotKV) -> int:
    return len(kv.keys) if kv.arena is None else len(kv.arena.keys)


def _kept(kv: SlotKV, part: str, layer: int, num_rows: int) -> torch.Tensor:  # [num_rows, Hkv, d]
    """The slot's first num_rows kept rows of `part` ("keys" or "values") at `layer`: from the
    capture before it enters an arena, from its arena entry after."""
    if kv.arena is None:
        return getattr(kv, part)[layer][:num_rows]
    return getattr(kv.arena, part)[layer][kv.entry, :num_rows]


@dataclass(slots=True)
class KVStore:
    """The arenas of one decoding run, by capacity (dropped with it)."""

    arenas: dict[int, KVArena] = field(default_factory=dict)

    def reserve(self, kvs: list[SlotKV], num_new_rows: list[int], num_headroom_rows: list[int]) -> None:
        """Room for each slot's kept rows + its new rows of this pass. A slot without it moves
        to the arena of capacity_for(kept + new rows, + its headroom when it enters the first
        time: the most rows its decoder may add), all the movers of an arena at once."""
        moving: dict[int, list[SlotKV]] = {}
        for kv, num_new, headroom in zip(kvs, num_new_rows, num_headroom_rows, strict=True):
            if kv.arena is None or kv.arena.capacity < kv.num_rows + num_new:
                capacity = capacity_for(kv.num_rows + num_new + (headroom if kv.arena is None else 0))
                moving.setdefault(capacity, []).append(kv)
        for capacity, movers in moving.items():
            if capacity not in self.arenas:
                self.arenas[capacity] = KVArena.like(capacity, movers[0])
            self.arenas[capacity].add(movers)

    @staticmethod
    def release(kv: SlotKV) -> None:
        """A finished slot frees its entry (and the arena its reference)."""
        if kv.arena is not None:
            kv.arena.owners[kv.entry] = None
            kv.arena, kv.entry = None, -1


@dataclass(slots=True)
class DecodeSpan:
    start: int  # first row in the decoding stream (a multiple of SCORE_CHUNK)
    num_rows: int  # rows of this slot, padded to SCORE_CHUNK
    num_real: int  # live hypotheses (rows past them are padding)
    kv: SlotKV  # in its arena, with room for num_rows more rows
    mask: torch.Tensor  # [num_rows, L + num_rows] bool over (slot rows so far, then the new rows)
    positions: torch.Tensor  # [num_rows] long positions of the new rows


@dataclass(slots=True)
class DecodeGroup:
    """The spans of a pass in one arena with the same rows per slot: one SDPA per layer over
    the arena's entries [first_entry, first_entry + num_entries). Host tensors; `on` copies."""

    arena: KVArena
    first_entry: int
    num_entries: int  # B
    num_rows: int  # n rows per entry
    query_rows: torch.Tensor  # [B * n] long stream row of each query (row 0 for entries not in the pass)
    rows: torch.Tensor  # [P * n] long stream rows of the group's spans
    write_rows: torch.Tensor  # [P * n] long their K/V's rows in the arena's flat [E * C] rows
    out_rows: torch.Tensor  # [P * n] long their rows in the group's flat [B * n] output
    mask: torch.Tensor  # [B, n, C] bool
    positions: torch.Tensor  # [B, n] long positions of the queries
    key_positions: torch.Tensor  # [B, C] long positions of the keys (0 past a slot's rows)
    _on: dict = field(default_factory=dict, repr=False)  # device / (window, device, G) -> tensors there

    def indices(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(query_rows, rows, write_rows, out_rows) on `device`, copied once per pass."""
        if device not in self._on:
            self._on[device] = tuple(to_device(t, device) for t in
                                     (self.query_rows, self.rows, self.write_rows, self.out_rows))
        return self._on[device]

    def attention_mask(self, sliding_window: int | None, device: torch.device, num_groups: int) -> torch.Tensor:
        """[B, 1, G * n, C]: `mask` narrowed to keys less than `sliding_window` positions back,
        repeated for the G query heads folded into each kv head; made once per pass."""
        key = (sliding_window, device, num_groups)
        if key not in self._on:
            mask = self.mask
            if sliding_window is not None:
                mask = mask & (self.positions[:, :, None] - self.key_positions[:, None, :] < sliding_window)
            b, n, c = mask.shape
            mask = mask[:, None, None].expand(b, 1, num_groups, n, c).reshape(b, 1, num_groups * n, c)
            self._on[key] = to_device(mask, device)
        return self._on[key]


@dataclass(slots=True)
class DecodeMetadata:
    spans: list[DecodeSpan]  # one per slot in the pass
    groups: list[DecodeGroup] = field(init=False)  # group_spans(spans): one SDPA per group and layer

    def __post_init__(self) -> None:
        self.groups = group_spans(self.spans)


def group_spans(spans: list[DecodeSpan]) -> list[DecodeGroup]:
    """The spans grouped by (arena, rows per slot), in order of first appearance."""
    by_key: dict[tuple[int, int], list[DecodeSpan]] = {}
    for span in spans:
        by_key.setdefault((id(span.kv.arena), span.num_rows), []).append(span)
    return [_group(members) for members in by_key.values()]


def _group(spans: list[DecodeSpan]) -> DecodeGroup:
    arena, n = spans[0].kv.arena, spans[0].num_rows
    capacity = arena.capacity
    first = min(span.kv.entry for span in spans)
    num_entries = max(span.kv.entry for span in spans) + 1 - first
    query_rows = torch.zeros(num_entries, n, dtype=torch.long)
    mask = torch.zeros(num_entries, n, capacity, dtype=torch.bool)
    mask[:, :, 0] = True  # entries not in the pass: a dummy query that sees one (finite) key
    positions = torch.zeros(num_entries, n, dtype=torch.long)
    key_positions = torch.zeros(num_entries, capacity, dtype=torch.long)
    rows, write_rows, out_rows = [], [], []
    for span in spans:
        entry, num_kept = span.kv.entry - first, span.kv.num_rows
        new = torch.arange(n)
        query_rows[entry] = span.start + new
        mask[entry] = False
        mask[entry, :, : num_kept + n] = span.mask
        positions[entry] = span.positions
        key_positions[entry, : num_kept + n] = torch.cat((span.kv.positions, span.positions))
        rows.append(span.start + new)
        write_rows.append(span.kv.entry * capacity + num_kept + new)
        out_rows.append(entry * n + new)
    return DecodeGroup(arena, first, num_entries, n, query_rows.flatten(), torch.cat(rows), torch.cat(write_rows),
                       torch.cat(out_rows), mask, positions, key_positions)


def decode_attention(
    q: torch.Tensor,  # [T, Hq, d]
    k: torch.Tensor,  # [T, Hkv, d]
    v: torch.Tensor,  # [T, Hkv, d]
    meta: DecodeMetadata,
    layer: int,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:  # [T, Hq, d]; rows outside every span are zero
    out = torch.zeros_like(q)
    for group in meta.groups:
        query_rows, rows, write_rows, out_rows = group.indices(q.device)
        keys, values = group.arena.keys[layer], group.arena.values[layer]  # [E, C, Hkv, d]
        keys.view(-1, *k.shape[1:]).index_copy_(0, write_rows, k.index_select(0, rows))  # in place
        values.view(-1, *v.shape[1:]).index_copy_(0, write_rows, v.index_select(0, rows))
        entries = slice(group.first_entry, group.first_entry + group.num_entries)
        num_groups = q.shape[1] // k.shape[1]
        attended = F.scaled_dot_product_attention(
            _fold(q.index_select(0, query_rows), group.num_rows, k.shape[1]),  # [B, Hkv, G * n, d]
            keys[entries].transpose(1, 2),  # [B, Hkv, C, d], a view
            values[entries].transpose(1, 2),
            attn_mask=group.attention_mask(sliding_window, q.device, num_groups),
            scale=scale,
        )  # [B, Hkv, G * n, d]
        out.index_copy_(0, rows, _unfold(attended, group.num_rows).index_select(0, out_rows))
    return out


def _fold(q: torch.Tensor, n: int, num_kv_heads: int) -> torch.Tensor:
    """[B * n, Hq, d] -> [B, Hkv, G * n, d]: query head h = kv head h // G (as repeat_interleave)."""
    rows, num_heads, d = q.shape
    g = num_heads // num_kv_heads
    return q.view(rows // n, n, num_kv_heads, g, d).permute(0, 2, 3, 1, 4).reshape(rows // n, num_kv_heads, g * n, d)


def _unfold(out: torch.Tensor, n: int) -> torch.Tensor:
    """[B, Hkv, G * n, d] -> [B * n, Hq, d]."""
    b, num_kv_heads, gn, d = out.shape
    g = gn // n
    return out.view(b, num_kv_heads, g, n, d).permute(0, 3, 1, 2, 4).reshape(b * n, num_kv_heads * g, d)


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
