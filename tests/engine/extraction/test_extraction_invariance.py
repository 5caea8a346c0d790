"""Batched decoding attention is batch invariant (CPU, tiny random qwen3 and gemma3_text: GQA,
sliding windows): a content's slot answers are bit-identical decoded alone or in passes
shared with other contents' slots of other lengths (other K/V capacities, the same capacity
at other arena entries), other widths (other rows per slot) and, with a small token budget,
passes that hold only some of an arena's entries. On its own, decode_attention matches one
SDPA per slot over exactly its keys, and a slot's output is bit-identical alone or in an
entry another slot left (stale rows) and after it outgrows its arena."""

from __future__ import annotations

import pytest
import torch

import engine.extraction.kv_cache as kv_cache
import engine.layers.decode_attention as decode_module
from contract.protocol import ScoringRequest
from engine.extraction.kv_cache import capacity_for
from engine.layers.attention import sdpa

QUERIES = [
    {"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"]},
    {"id": "name", "template": "\n\nQ: Who wrote this?\nA: \"{*}\"", "max_tokens": 4, "floor": True},
    {"id": "wide", "template": "\n\nThe product:{*}\n", "max_tokens": 3, "beam_width": 12},
    {"id": "amount", "template": "\n\nQ: What amount?\nA:{$}", "max_tokens": 4, "beam_width": 3},
    {"id": "note", "template": "\n\nA: \"{*}\"", "mode": "generate", "max_tokens": 4},
]
TARGET = "Maria Lopez was charged $89.97 twice in September for 3 kettles."
FILLER = " The order number is 2291 and the parcel left the warehouse in Leeds on Monday."


def _request(content: str, queries: list[dict]) -> ScoringRequest:
    return ScoringRequest.model_validate({"messages": [{"role": "user", "content": content}],
                                          "scoring": {"queries": queries}})


def _others() -> list[ScoringRequest]:
    """Contents from shorter than the target to ~10x longer; some ask only a wide slot."""
    contents = [f"Note {i}:" + FILLER * i for i in (0, 1, 3, 6, 10)]
    return [_request(c, QUERIES if i % 2 == 0 else QUERIES[2:3]) for i, c in enumerate(contents)]


def _counting_attention(monkeypatch) -> list[tuple[int, int]]:
    """Patch decode_attention to note (slots, SDPA groups) of every call."""
    calls: list[tuple[int, int]] = []
    attention = decode_module.decode_attention

    def counting(q, k, v, meta, *args, **kwargs):
        calls.append((len(meta.spans), len(meta.groups)))
        return attention(q, k, v, meta, *args, **kwargs)

    monkeypatch.setattr(decode_module, "decode_attention", counting)
    return calls


@pytest.mark.parametrize("family,budget", [("qwen3", None), ("gemma3_text", 128)])
def test_slot_answers_alone_vs_batched_are_bit_identical(tiny_engine, monkeypatch, family, budget):
    engine = tiny_engine(family) if budget is None else tiny_engine(family, max_num_batched_tokens=budget)
    target, others = _request(TARGET, QUERIES), _others()
    alone = engine.score_requests([target]).results[0].model_dump()
    calls = _counting_attention(monkeypatch)
    packed = engine.score_requests(others[:3] + [target] + others[3:]).results[3].model_dump()
    for response in (alone, packed):
        response.pop("usage")
    assert alone == packed  # answers, values, p, residual, floor_p: bit for bit
    assert any(groups < slots for slots, groups in calls), "no pass shared an SDPA between slots"
    assert max(groups for _, groups in calls) >= 2, "every slot landed in one arena: lengths too alike"


@pytest.mark.parametrize("family,budget", [("qwen3", None), ("gemma3_text", 128)])
def test_held_layout_gives_the_bits_of_the_compact_one(tiny_engine, monkeypatch, family, budget):
    """With decode graphs on (on CPU none is captured) a slot that finished stays in its pass as
    padding rows writing its entry's tail, so the passes keep one shape: every answer, p,
    residual and floor is bit-identical to decoding the live slots alone, and shapes repeat."""
    import engine.pipeline.decode_graphs as graphs_module

    config = {} if budget is None else {"max_num_batched_tokens": budget}
    requests = _others()[:3] + [_request(TARGET, QUERIES)] + _others()[3:]
    compact = [r.model_dump() for r in tiny_engine(family, **config).score_requests(requests).results]
    held_engine = tiny_engine(family, decode_graphs=True, **config)
    assert held_engine.runner.decode_graphs().capture is False
    shapes, held = [], []
    logprobs = graphs_module.DecodeGraphs.logprobs

    def noting(self, batch, forward):
        shapes.append(graphs_module.pass_shape(batch))
        held.append(sum(span.num_real == 0 for span in batch.decode.spans))
        return logprobs(self, batch, forward)

    monkeypatch.setattr(graphs_module.DecodeGraphs, "logprobs", noting)
    results = [r.model_dump() for r in held_engine.score_requests(requests).results]
    for response in results + compact:  # the other engine may have cached a floor
        response["usage"] = response["usage"]["slot_tokens"]  # a held slot's padding rows are not its tokens
    assert results == compact
    assert max(held) > 0, "no finished slot was held"
    assert len(shapes) - len(set(shapes)) >= len(shapes) // 2, "passes seldom had a shape seen before"


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_layouts_packed_again_to_the_arena_front_give_the_same_bits(tiny_engine, monkeypatch, family):
    """Decode graphs on, a new layout as soon as half the rows are held: the live slots' K/V
    moves to the front of its arena each time (KVStore.pack_front), and every answer, p,
    residual and floor is bit-identical to decoding without graphs."""
    from engine.extraction import decoding

    requests = _others()[:3] + [_request(TARGET, QUERIES)] + _others()[3:]
    eager = [r.model_dump() for r in tiny_engine(family).score_requests(requests).results]
    monkeypatch.setattr(decoding, "HELD_ROWS_WORTH_COMPACTING", 0)
    moved = []
    pack_front = kv_cache.KVArena.pack_front

    def noting(self, kvs):
        moved.append(sum(new != kv.entry for new, kv in enumerate(kvs)))
        return pack_front(self, kvs)

    monkeypatch.setattr(kv_cache.KVArena, "pack_front", noting)
    packed = [r.model_dump() for r in tiny_engine(family, decode_graphs=True).score_requests(requests).results]
    for response in packed + eager:
        response["usage"] = response["usage"]["slot_tokens"]
    assert packed == eager
    assert sum(moved) > 0, "no layout moved a slot to the front of its arena"


def test_capacity_depends_only_on_the_rows_and_bounds_the_padding():
    capacities = [capacity_for(n) for n in range(1, 5000)]
    assert capacities[:64] == [64] * 64
    assert sorted(set(capacities))[:8] == [64, 96, 128, 192, 256, 384, 512, 768]
    for n, capacity in enumerate(capacities, start=1):
        assert n <= capacity < max(1.5 * n + 1, 65) and capacity % 32 == 0


# ---- decode_attention on its own: arenas, entry reuse, growth ----------------------------

NUM_LAYERS, HQ, HKV, D = 2, 4, 2, 16


_HISTORY: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(slot) -> its layer-1 keys, values so far


def _slot(num_prompt: int, seed: int) -> kv_cache.SlotKV:
    g = torch.Generator().manual_seed(seed)
    keys = [torch.randn(num_prompt, HKV, D, generator=g) for _ in range(NUM_LAYERS)]
    values = [torch.randn(num_prompt, HKV, D, generator=g) for _ in range(NUM_LAYERS)]
    kv = kv_cache.SlotKV(keys, values, torch.arange(num_prompt), num_prompt)
    _HISTORY[id(kv)] = (keys[1].clone(), values[1].clone())  # kept apart from the arenas
    return kv


def _rows(seed: int) -> tuple[torch.Tensor, ...]:
    """q [8, Hq, d], k and v [8, Hkv, d] of one slot's rows in one pass."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(8, h, D, generator=g) for h in (HQ, HKV, HKV))


def _attend(store, slots: list, num_real: list[int], step: int, window: int | None = None) -> list[tuple]:
    """One pass over `slots` (8 rows each, `num_real` live; a slot's q/k/v from its prompt
    length and the step): each slot's live output rows (layer 1) and their reference, one
    SDPA over exactly its keys so far (the test's own copy, not the arena's) + new keys; the
    arena's kept rows must equal that copy. The new rows join the slots."""
    store.reserve(slots, [8] * len(slots), [0] * len(slots))
    spans = []
    for index, (kv, real) in enumerate(zip(slots, num_real)):
        own = [list(range(kv.num_prompt_rows, kv.num_rows))] * real  # each row: every decoded row so far
        positions = torch.full((8,), kv.num_rows)
        spans.append(decode_module.DecodeSpan(8 * index, 8, real, kv, decode_module.decode_mask(kv, own, 8), positions,
                                              kv.num_rows))
    meta = decode_module.DecodeMetadata(spans)
    blocks = [_rows(1000 * step + kv.num_prompt_rows) for kv in slots]
    q, k, v = (torch.cat([b[i] for b in blocks] + [torch.zeros(8, *blocks[0][i].shape[1:])]) for i in range(3))
    references = []
    for span in spans:  # before the pass: the slot's rows so far, and the arena's copy of them
        kept_keys, kept_values = _HISTORY[id(span.kv)]
        assert torch.equal(span.kv.arena.keys[1][span.kv.entry, : span.kv.num_rows], kept_keys)
        assert torch.equal(span.kv.arena.values[1][span.kv.entry, : span.kv.num_rows], kept_values)
        keys = torch.cat((kept_keys, k[span.start : span.start + 8]))
        values = torch.cat((kept_values, v[span.start : span.start + 8]))
        mask = span.mask
        if window is not None:
            key_positions = torch.cat((span.kv.positions, span.positions))
            mask = mask & (span.positions[:, None] - key_positions[None, :] < window)
        references.append(sdpa(q[span.start : span.start + 8], keys, values, mask, 0.25))
    out = decode_module.decode_attention(q, k, v, meta, 1, 0.25, window)
    for span in spans:
        span.kv.positions = torch.cat((span.kv.positions, span.positions[: span.num_real]))
        real = slice(span.start, span.start + span.num_real)
        kept_keys, kept_values = _HISTORY[id(span.kv)]
        _HISTORY[id(span.kv)] = (torch.cat((kept_keys, k[real])), torch.cat((kept_values, v[real])))
    return [(out[s.start : s.start + s.num_real], r[: s.num_real]) for s, r in zip(spans, references)]


@pytest.mark.parametrize("window", [None, 5])
def test_decode_attention_alone_vs_reused_entries_and_growth(window):
    alone_store, target = kv_cache.KVStore(), _slot(50, 0)
    alone = [_attend(alone_store, [target], [3], step, window)[0][0] for step in range(4)]

    store, target = kv_cache.KVStore(), _slot(50, 0)
    first = [_slot(20, 1), _slot(40, 2), _slot(100, 3)]
    _attend(store, first, [8, 2, 5], 99, window)  # fills entries, then frees one of the 64s
    kv_cache.KVStore.release(first[0])
    batched = []
    for step in range(4):  # the target takes first[0]'s stale entry; grows past 64 keys at step 3
        results = _attend(store, [first[1], target, first[2]], [1, 3, 8], step, window)
        batched.append(results[1][0])
        assert step == 3 or (target.arena is first[1].arena and target.entry == 0)  # first[0]'s old entry
        for out, reference in results:
            assert torch.allclose(out, reference, atol=1e-5)
    assert target.arena.capacity == 96 and first[1].arena.capacity == 64
    for a, b in zip(alone, batched):
        assert torch.equal(a, b)  # bit for bit


def test_an_arena_that_grows_keeps_the_rows_it_holds():
    """Slots arrive at a full arena: it grows (one copy of every layer) and every slot already
    in it keeps its rows bit for bit (_attend compares the arena with the test's own copy)."""
    store = kv_cache.KVStore()
    first = [_slot(20, 1), _slot(40, 2)]
    _attend(store, first, [2, 2], 0)
    arena, num_entries = first[0].arena, len(first[0].arena.owners)
    more = [_slot(30, 4), _slot(10, 5), _slot(45, 6)]
    for step in (1, 2):
        for out, reference in _attend(store, first + more, [2, 2, 1, 1, 1], step):
            assert torch.allclose(out, reference, atol=1e-5)
    assert all(kv.arena is arena for kv in first + more) and len(arena.owners) > num_entries
    full = len(arena.owners)  # every entry taken: one more slot must grow it again, at least doubling
    last = [_slot(25, 7)]
    for out, reference in _attend(store, first + more + last, [2, 2, 1, 1, 1, 1], 3):
        assert torch.allclose(out, reference, atol=1e-5)
    assert last[0].arena is arena and len(arena.owners) >= 2 * full


def test_packing_an_arena_to_its_front_keeps_each_slots_rows_and_outputs():
    """pack_front: the slots kept move to entries 0, 1, ... (their rows bit for bit: _attend
    compares the arena with the test's own copy), the others are detached; a pass after it
    gives a kept slot the output it has in an arena that was never packed."""
    never_packed, target_alone = kv_cache.KVStore(), _slot(30, 4)
    for step in range(2):
        expected = _attend(never_packed, [target_alone], [2], step)[0][0]

    store = kv_cache.KVStore()
    slots = [_slot(20, 1), _slot(40, 2), _slot(25, 3), _slot(30, 4), _slot(10, 5)]
    _attend(store, slots, [2, 2, 1, 2, 1], 0)
    arena = slots[3].arena
    assert all(kv.arena is arena for kv in slots) and slots[3].entry == 3
    store.pack_front([slots[3], slots[1]])
    assert (slots[1].entry, slots[3].entry) == (0, 1)  # by entry: 1 before 3
    assert arena.owners[:2] == [slots[1], slots[3]] and not any(arena.owners[2:])
    assert all(kv.arena is None and kv.entry == -1 for kv in (slots[0], slots[2], slots[4]))
    results = _attend(store, [slots[1], slots[3]], [2, 2], 1)
    for out, reference in results:
        assert torch.allclose(out, reference, atol=1e-5)
    assert torch.equal(results[1][0], expected)  # bit for bit with the slot's never-packed pass


def test_passes_padded_to_a_larger_row_multiple_give_the_same_bits(tiny_engine, monkeypatch):
    """A decoding pass padded to 384 rows (the "blas" decoding matmul's row block on CUDA)
    gives every answer, p, residual and floor bit for bit as one padded to ROW_CHUNK."""
    from engine.pipeline.runner import ModelRunner

    requests = _others()[:2] + [_request(TARGET, QUERIES)]
    plain = [r.model_dump() for r in tiny_engine("gemma3_text").score_requests(requests).results]
    rows = []
    monkeypatch.setattr(ModelRunner, "decoding_row_multiple", lambda self: 384)
    decode = ModelRunner.decode

    def noting(self, batch, graphs=None):
        rows.append(batch.input_ids.shape[0])
        return decode(self, batch, graphs)

    monkeypatch.setattr(ModelRunner, "decode", noting)
    padded = [r.model_dump() for r in tiny_engine("gemma3_text").score_requests(requests).results]
    assert padded == plain
    assert rows and all(n % 384 == 0 for n in rows)


def test_the_slots_of_one_content_share_a_trunk_of_equal_rows(tiny_engine, monkeypatch):
    """The read gives the slots of one tree one Trunk: their kept K/V rows below it are equal
    in every layer (what lets the decoding attention read one copy for all), and it is the
    longest such prefix (the next row differs for two of them); other contents get others."""
    from engine.extraction.decoding import Extraction

    engine = tiny_engine("gemma3_text")
    kept = []
    collect = Extraction.collect

    def keeping(self, batch, output):
        for packed in batch.trees:
            for kv in output.slot_kv[packed.slot_start : packed.slot_start + len(packed.tree.slot_branch)]:
                kept.append((packed.owner.request_index, kv, list(kv.keys), list(kv.values)))  # before the arenas take them
        return collect(self, batch, output)

    monkeypatch.setattr(Extraction, "collect", keeping)
    engine.score_requests([_request(TARGET, QUERIES), _request(TARGET + FILLER, QUERIES)])
    by_request: dict[int, list] = {}
    for request, *slot in kept:
        by_request.setdefault(request, []).append(slot)
    assert sorted(by_request) == [0, 1] and all(len(slots) == 4 for slots in by_request.values())  # 4 slots each
    trunks = [slots[0][0].trunk for slots in by_request.values()]
    assert trunks[0] is not trunks[1]
    for slots, trunk in zip(by_request.values(), trunks):
        assert all(kv.trunk is trunk for kv, _, _ in slots)
        assert 10 < trunk.num_rows < min(kv.num_prompt_rows for kv, _, _ in slots)
        rows = slice(0, trunk.num_rows)
        for part in (1, 2):  # keys, values
            for layer, first in enumerate(slots[0][part]):
                assert all(torch.equal(slot[part][layer][rows], first[rows]) for slot in slots)
        next_rows = [keys[0][trunk.num_rows] for _, keys, _ in slots]
        assert any(not torch.equal(row, next_rows[0]) for row in next_rows), "the trunk stops short"
