"""Keys and values kept from the read, stored for the decoding passes that reuse them
(their attention: engine/layers/decode_attention.py).

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
    new layout (decode graphs: engine/extraction/decoding.py): KVStore.pack_front moves the
        live slots to the front of their arenas (one copy per layer), so the passes after it
        attend over their entries only, not over the range the finished ones left

So a content is read once, a slot's rows are never re-copied per step, and a pass runs one
SDPA per layer for each (capacity, rows) pair present (a few, not one per slot).

Trunk: the slots of one tree share their path's first rows (the content, and the template up
to where their questions part: `Trunk.num_rows`, from the packer). Each slot's entry holds its
own copy of them, the same values; with engine/layers/decode_attention.py SHARED_TRUNKS on
(the default; docs/extraction.md has its timing), the Triton decoding attention reads one sibling's
copy for all of them (`DecodeGroup.spans`' trunk columns), so those reads can come from L2.

Batch invariance (a slot's answers do not depend on what is decoded beside it):
- A slot's attention problem has shapes that depend only on that slot: n query rows (its live
  hypotheses padded to SCORE_CHUNK; with GQA its Hq/Hkv query heads folded into G·n rows of
  one kv head, no K/V copy) against C keys, the padding keys masked. C = capacity_for(its
  rows + its decoder's most rows) when it enters, capacity_for(its rows + n) if it outgrows
  that: its own numbers only, never the longest slot of the pass.
- SDPA computes each batch entry on its own: the same kernel, the same shapes, whatever the
  batch size or the entry's place in it (CPU: the flash kernel splits work by (entry, head,
  query block); CUDA: the memory-efficient kernel's grid is (query block, head, entry), no
  split over keys). `tests/engine/extraction/test_extraction_invariance.py` checks answers alone vs.
  batched bit for bit on CPU; `tests/engine/extraction/test_gpu_slots.py` on CUDA.
- Keys past a slot's written rows are zeros or stale rows (its own, or those of the entry's
  earlier owner): finite, so masked keys add exactly nothing (score -inf, weight 0, 0 · v = 0). Entries of the range not in this pass (finished or
  decoded in another pass) get a dummy query and are discarded.
Padding a slot's keys from L + n to C changes SDPA's reduction against the per-slot SDPA of
before (tests/engine/extraction/test_extraction_reference.py: equal answers, |Δp| ≤ 1e-5).

CUDA: the index tensors and masks reach the device once per pass through `ops.to_device`
(pinned, non-blocking); decode_attention does no host sync (no .item(), no .tolist()).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.layers.ops import to_device

MIN_CAPACITY = 64  # key rows of the smallest arena; capacities 64, 96, 128, 192, 256, 384, ...


def capacity_for(num_rows: int) -> int:
    """The key capacity of a slot needing `num_rows` rows (at most 1.5x them, a multiple of 32):
    it depends on that number only."""
    capacity = MIN_CAPACITY
    while capacity < num_rows:
        capacity = capacity * 3 // 2 if capacity & (capacity - 1) == 0 else capacity * 4 // 3
    return capacity


@dataclass(slots=True, eq=False)
class Trunk:
    """The prompt rows the slots of one tree (one content) share, read in one pass: each of
    them holds a copy of these rows, the same values (the decoding attention may read one
    sibling's copy for all of them: engine/kernels/decode_attention.py)."""

    num_rows: int  # the first num_rows kept rows of every slot with this trunk are the same


@dataclass(slots=True, eq=False)
class SlotKV:
    """One slot's keys and values: the prompt path, then every decoded token."""

    keys: list[torch.Tensor]  # per layer [P, Hkv, d] prompt K/V as captured; [] once in an arena
    values: list[torch.Tensor]  # per layer [P, Hkv, d]
    positions: torch.Tensor  # [L] long (host) RoPE position of each kept row
    num_prompt_rows: int  # rows 0..num_prompt_rows-1 are the prompt; every hypothesis sees them
    arena: KVArena | None = None  # where its rows live while it is decoded
    entry: int = -1  # its entry in `arena`
    trunk: Trunk | None = None  # the rows it shares with the other slots of its tree

    @property
    def num_rows(self) -> int:
        return int(self.positions.shape[0])


@dataclass(slots=True)
class KVCapture:
    """Set on a packed pass that holds slots: keeps their prompt paths' K/V, layer by layer."""

    rows: torch.Tensor  # [R] long stream rows of every slot's prompt path, slot after slot, root first (on the pass's device once saved)
    lengths: list[int]  # rows per slot
    trunks: list[tuple[int, int]] = field(default_factory=list)  # per slot: (its tree in the pass, rows shared by every slot path of that tree)
    keys: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [R, Hkv, d]
    values: dict[int, torch.Tensor] = field(default_factory=dict)

    def save(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.rows.device != k.device:  # once per pass, pinned and non-blocking (a pageable copy waits for the GPU)
            self.rows = to_device(self.rows, k.device)
        rows = self.rows
        self.keys[layer] = k.index_select(0, rows)
        self.values[layer] = v.index_select(0, rows)

    def split(self) -> list[SlotKV]:
        layers = sorted(self.keys)
        keys = [self.keys[i].split(self.lengths) for i in layers]
        values = [self.values[i].split(self.lengths) for i in layers]
        trunks = {tree: Trunk(num_rows) for tree, num_rows in self.trunks}  # one per tree
        return [
            SlotKV([k[s] for k in keys], [v[s] for v in values], torch.arange(n), n,
                   trunk=trunks[self.trunks[s][0]] if self.trunks else None)
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

    def pack_front(self, kvs: list[SlotKV]) -> None:
        """Every other entry freed, `kvs` (in this arena) moved to entries 0, 1, ... in their
        order: one gather and one copy per layer. The attention of a later pass over them then
        covers len(kvs) entries, not the range they were scattered over."""
        kept = {id(kv) for kv in kvs}
        for owner in self.owners:
            if owner is not None and id(owner) not in kept:
                owner.arena, owner.entry = None, -1  # freed: its K/V is no longer read
        moves = [(kv.entry, new) for new, kv in enumerate(kvs)]
        self.owners = [None] * len(self.owners)
        for (_, new), kv in zip(moves, kvs, strict=True):
            kv.entry, self.owners[new] = new, kv
        moves = [(old, new) for old, new in moves if old != new]
        if not moves:
            return
        device = self.keys[0].device
        src = to_device(torch.tensor([old for old, _ in moves]), device)
        dst = to_device(torch.tensor([new for _, new in moves]), device)
        for tensors in (self.keys, self.values):
            for layer in tensors:
                layer.index_copy_(0, dst, layer.index_select(0, src))  # gathered first: overlapping moves are safe

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

    def pack_front(self, kvs: list[SlotKV]) -> None:
        """Each arena's entries reduced to the given slots' (the others freed), moved to its front."""
        by_arena: dict[int, list[SlotKV]] = {id(arena): [] for arena in self.arenas.values()}
        for kv in kvs:
            if kv.arena is not None:
                by_arena[id(kv.arena)].append(kv)
        for arena in self.arenas.values():
            arena.pack_front(sorted(by_arena[id(arena)], key=lambda kv: kv.entry))

    @staticmethod
    def release(kv: SlotKV) -> None:
        """A finished slot frees its entry (and the arena its reference)."""
        if kv.arena is not None:
            kv.arena.owners[kv.entry] = None
            kv.arena, kv.entry = None, -1
