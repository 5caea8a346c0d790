"""Attention of a decoding pass over its slots' kept K/V: one launch per attention group and layer.

    q [T, Hq, d], k / v [T, Hkv, d]: the pass's rows ──┐
    keys / values [E, C, Hkv, d]: one layer of an arena ├─ decode_attention_kernel, grid (P spans, Hkv):
    spans [P, 7] int32, mask [P, n, C] bool ────────────┘
        1. the span's n new rows of k / v are written into its entry at first_new (in place)
        2. its G query heads x n rows attend to its entry's keys [key_lo, key_hi) (those below
           trunk_end read from the trunk's entry), BLOCK_N keys at a time (online softmax in
           fp32), as its [n, C] mask allows
    ──> out [T, Hq, d] at the span's rows (other rows untouched)

A spans row is (start: the span's first row in the pass, entry: its entry in the arena,
first_new: where its new rows' K/V go, key_lo, key_hi: the keys it attends to; a live slot
0 .. first_new + n, a held one only its own padding rows first_new .. first_new + n;
trunk_entry, trunk_end: keys below trunk_end, a multiple of BLOCK_N, are read from entry
trunk_entry instead of its own).

The trunk: the slots of one content hold the same K/V rows for the prompt they share (copies
of the same captured rows, engine/extraction/kv_cache.py). Pointed at one sibling's entry for
those rows, the siblings' programs, which run side by side (grid order: spans first), read
the same addresses, and the L2 cache can serve all but the first read of each block. The values
read are the same, so the bits are too, whichever sibling's entry is read, or none
(`trunks=False` compiles the kernel without the trunk columns' reads).

It replaces, per group and layer, the gathers of q and the new rows, their copies into the
arena, SDPA over every entry of the group's range at full capacity (masked keys read too),
and the scatter of the output: here a span reads only keys below key_hi, a held (finished)
slot only its own rows, and entries not in the pass not at all.

Why invariant: a program computes one span and one kv head from that span's rows, entry and
mask alone; its key loop starts at key_lo and walks BLOCK_N keys at a time in order, so its
sums are the same whatever else the pass holds, wherever the span sits in it, and whether
the pass is launched or replayed from a CUDA graph. The bits are not SDPA's (another
reduction order); `decode_attention_reference` is the same attention in fp32 in torch.
"""

from __future__ import annotations

import math

import torch

from engine.kernels._triton import HAS_TRITON, jit, next_power_of_2, tl

SPAN_FIELDS = 7  # start, entry, first_new, key_lo, key_hi, trunk_entry, trunk_end
BLOCK_N = 64  # keys per step of a program's loop (fixed: changing it changes the sums)
MASKED = -1.0e30  # the running maximum's start: finite, so a row that has seen no key yet adds exp2(-inf) = 0


def decode_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
    spans: torch.Tensor, mask: torch.Tensor, num_rows: int, scale: float, out: torch.Tensor,
) -> torch.Tensor:
    """The kernel's work in torch (fp32 softmax, one span at a time): the new rows written
    into `keys` / `values`, then each span's rows written into `out`."""
    num_kv_heads = k.shape[1]
    g = q.shape[1] // num_kv_heads
    for span, (start, entry, first_new, key_lo, key_hi, trunk_entry, trunk_end) in enumerate(spans.tolist()):
        rows = slice(start, start + num_rows)
        keys[entry, first_new : first_new + num_rows] = k[rows]
        values[entry, first_new : first_new + num_rows] = v[rows]
        shared = slice(key_lo, max(key_lo, trunk_end))  # read from the trunk's entry
        own = slice(max(key_lo, trunk_end), key_hi)
        kk = torch.cat((keys[trunk_entry, shared], keys[entry, own])).float().repeat_interleave(g, dim=1)  # [L, Hq, d]
        vv = torch.cat((values[trunk_entry, shared], values[entry, own])).float().repeat_interleave(g, dim=1)
        scores = torch.einsum("nhd,lhd->hnl", q[rows].float(), kk) * scale  # [Hq, n, L]
        scores = scores.masked_fill(~mask[span, :, key_lo:key_hi].bool()[None], -math.inf)
        out[rows] = torch.einsum("hnl,lhd->nhd", scores.softmax(dim=-1), vv).to(out.dtype)
    return out


@jit(do_not_specialize=["capacity", "num_rows"])  # one compile per (rows block, G, d), not per arena or span size
def decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, keys_ptr, values_ptr, spans_ptr, mask_ptr, out_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_ae, stride_ac, stride_ah, capacity, scale_log2, num_rows,
    ROWS_BLOCK: tl.constexpr, GROUPS: tl.constexpr, GROUPS_BLOCK: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, TRUNKS: tl.constexpr,
    FIELDS: tl.constexpr,
):
    span = tl.program_id(0)
    head = tl.program_id(1)  # kv head
    fields = spans_ptr + span * FIELDS  # SPAN_FIELDS, in their order
    start = tl.load(fields + 0)
    entry = tl.load(fields + 1).to(tl.int64)
    first_new = tl.load(fields + 2)
    key_lo = tl.load(fields + 3)
    key_hi = tl.load(fields + 4)
    trunk_entry = tl.load(fields + 5).to(tl.int64)
    trunk_end = tl.load(fields + 6)
    dims = tl.arange(0, HEAD_DIM)
    entry_keys = keys_ptr + entry * stride_ae + head * stride_ah
    entry_values = values_ptr + entry * stride_ae + head * stride_ah

    # 1. this span's new rows into its entry (only this program reads this entry's head)
    new = tl.arange(0, ROWS_BLOCK)
    is_new = (new < num_rows)[:, None]
    src = (start + new)[:, None].to(tl.int64)
    dst = (first_new + new)[:, None] * stride_ac + dims[None, :]
    tl.store(entry_keys + dst, tl.load(k_ptr + src * stride_kt + head * stride_kh + dims[None, :], mask=is_new),
             mask=is_new)
    tl.store(entry_values + dst, tl.load(v_ptr + src * stride_vt + head * stride_vh + dims[None, :], mask=is_new),
             mask=is_new)
    tl.debug_barrier()  # the stores above are seen by every thread of the program below

    # 2. query j = (head's group g, row i), GROUPS_BLOCK x ROWS_BLOCK of them, the real ones i < n, g < G
    j = tl.arange(0, GROUPS_BLOCK * ROWS_BLOCK)
    g = j // ROWS_BLOCK
    i = j % ROWS_BLOCK
    is_query = (g < GROUPS) & (i < num_rows)
    query_rows = (start + i).to(tl.int64)
    query_heads = head * GROUPS + g
    q = tl.load(q_ptr + query_rows[:, None] * stride_qt + query_heads[:, None] * stride_qh + dims[None, :],
                mask=is_query[:, None], other=0.0)  # [J, d]
    row_mask = mask_ptr + (span.to(tl.int64) * num_rows + i)[:, None] * capacity  # [J, 1] the row's mask
    m = tl.full((GROUPS_BLOCK * ROWS_BLOCK,), MASKED, tl.float32)
    total = tl.zeros((GROUPS_BLOCK * ROWS_BLOCK,), tl.float32)
    acc = tl.zeros((GROUPS_BLOCK * ROWS_BLOCK, HEAD_DIM), tl.float32)
    for first in range(key_lo, key_hi, BLOCK_N):
        cols = first + tl.arange(0, BLOCK_N)
        is_key = cols < key_hi
        if TRUNKS:  # the trunk's entry below trunk_end: the same values
            source = tl.where(first < trunk_end, trunk_entry, entry)
        else:
            source = entry
        kv_rows = source * stride_ae + head * stride_ah + cols[:, None] * stride_ac + dims[None, :]
        block_keys = tl.load(keys_ptr + kv_rows, mask=is_key[:, None], other=0.0)  # [BLOCK_N, d]
        scores = tl.dot(q, tl.trans(block_keys)) * scale_log2  # [J, BLOCK_N], log2 units
        seen = tl.load(row_mask + cols[None, :], mask=is_query[:, None] & is_key[None, :], other=0) != 0
        scores = tl.where(seen, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        block_values = tl.load(values_ptr + kv_rows, mask=is_key[:, None], other=0.0)  # [BLOCK_N, d]
        acc = acc * alpha[:, None] + tl.dot(p.to(block_values.dtype), block_values)
        m = m_new
    acc = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(out_ptr + query_rows[:, None] * stride_ot + query_heads[:, None] * stride_oh + dims[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=is_query[:, None])


def decode_attention(
    q: torch.Tensor,  # [T, Hq, d]
    k: torch.Tensor,  # [T, Hkv, d] (rows may be strided, as views of the q/k/v matmul's output)
    v: torch.Tensor,  # [T, Hkv, d]
    keys: torch.Tensor,  # [E, C, Hkv, d] one layer of the group's arena, written in place
    values: torch.Tensor,  # [E, C, Hkv, d]
    spans: torch.Tensor,  # [P, 7] int32 on q's device
    mask: torch.Tensor,  # [P, n, C] bool on q's device
    num_rows: int,  # n rows per span
    scale: float,
    out: torch.Tensor,  # [T, Hq, d], the spans' rows written
    trunks: bool = True,  # False: the trunk columns are ignored, every span reads its own entry
) -> torch.Tensor:
    """Launch decode_attention_kernel for one group (grid: its spans x kv heads)."""
    check_inputs(q, k, v, keys, values, spans, mask, num_rows, out)
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    groups = q.shape[1] // num_kv_heads
    rows_block = max(next_power_of_2(num_rows), 16 // next_power_of_2(groups), 1)  # tl.dot needs 16 query rows
    decode_attention_kernel[(spans.shape[0], num_kv_heads)](
        q, k, v, keys, values, spans, mask.view(torch.uint8), out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        keys.stride(0), keys.stride(1), keys.stride(2), keys.shape[1], scale * math.log2(math.e), num_rows,
        ROWS_BLOCK=rows_block, GROUPS=groups, GROUPS_BLOCK=next_power_of_2(groups),
        HEAD_DIM=head_dim, BLOCK_N=BLOCK_N, MASKED=MASKED, TRUNKS=trunks, FIELDS=SPAN_FIELDS, num_warps=4, num_stages=2,
    )
    return out


def check_inputs(q, k, v, keys, values, spans, mask, num_rows: int, out) -> None:
    if not HAS_TRITON:
        raise RuntimeError("decode_attention: Triton is not installed")
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    if q.shape[1] % num_kv_heads or q.shape[2] != head_dim or head_dim & (head_dim - 1):
        raise ValueError(f"decode_attention: q {tuple(q.shape)} and k {tuple(k.shape)}: Hq must be a multiple"
                         " of Hkv and the head dim a power of two")
    if keys.shape != values.shape or keys.shape[2:] != k.shape[1:] or keys.stride(3) != 1 or q.stride(2) != 1:
        raise ValueError(f"decode_attention: arena {tuple(keys.shape)} does not hold k's heads {tuple(k.shape[1:])}")
    if k.stride(2) != 1 or v.stride(2) != 1 or out.shape != q.shape or out.stride(2) != 1:
        raise ValueError("decode_attention: head dims must be contiguous")
    if spans.dtype != torch.int32 or spans.shape[1:] != (SPAN_FIELDS,):
        raise ValueError(f"decode_attention: spans must be [P, {SPAN_FIELDS}] int32, got {tuple(spans.shape)} {spans.dtype}")
    if mask.dtype != torch.bool or tuple(mask.shape) != (spans.shape[0], num_rows, keys.shape[1]) \
            or not mask.is_contiguous() or not spans.is_contiguous():
        raise ValueError(f"decode_attention: mask must be a contiguous [P, n, C] bool, got {tuple(mask.shape)} {mask.dtype}")
