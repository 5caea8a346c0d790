"""engine/kernels/decode_attention.py: the decoding passes' attention kernel against its torch
reference (interpreted on CPU, bf16 on the GPU), spans alone vs among others bit for bit."""

import pytest
import torch
from interpreted import run_interpreted
from kernel_inputs import fresh

from engine.kernels.decode_attention import BLOCK_N, decode_attention, decode_attention_reference


def test_decode_attention_kernel_interpreted():
    run_interpreted("decode_attention")


def test_decode_groups_drive_the_kernel_to_sdpas_outputs_interpreted():
    run_interpreted("decode_attention_groups")


def _gemma_spans(device, num_rows: int = 8, capacity: int = 1024, num_spans: int = 12):
    """Spans of a Gemma-3-12B decoding pass (Hq 16, Hkv 8, d 256): kept rows of 300-1000 keys,
    every third span held."""
    gen = torch.Generator().manual_seed(21)
    table, masks = [], []
    for span in range(num_spans):
        first_new = int(torch.randint(300, capacity - num_rows, (1,), generator=gen))
        held = span % 3 == 2
        first_new = capacity - num_rows if held else first_new
        mask = torch.zeros(num_rows, capacity, dtype=torch.bool)
        if not held:
            mask[:, :first_new] = torch.rand(num_rows, first_new, generator=gen) < 0.9
        mask[torch.arange(num_rows), first_new + torch.arange(num_rows)] = True
        table.append([span * num_rows, span, first_new, first_new if held else 0, first_new + num_rows, span, 0])
        masks.append(mask)
    return (torch.tensor(table, dtype=torch.int32, device=device), torch.stack(masks).to(device))


@pytest.mark.gpu
def test_gpu_decode_attention_matches_reference_and_spans_keep_their_bits(cuda):
    num_rows, capacity = 8, 1024
    spans, mask = _gemma_spans(cuda, num_rows, capacity)
    rows = spans.shape[0] * num_rows + 64
    qkv = fresh((rows, (16 + 2 * 8) * 256), cuda, seed=22)
    q = qkv[:, : 16 * 256].view(rows, 16, 256).contiguous()
    k, v = qkv[:, 16 * 256 : 24 * 256].view(rows, 8, 256), qkv[:, 24 * 256 :].view(rows, 8, 256)  # strided rows
    keys, values = (fresh((spans.shape[0], capacity, 8, 256), cuda, seed=s) for s in (23, 24))

    def run(fn, spans, mask):
        arena = keys.clone(), values.clone()
        out = torch.zeros_like(q)
        fn(q, k, v, *arena, spans, mask, num_rows, 256**-0.5, out)
        return out, arena

    got, got_arena = run(decode_attention, spans, mask)
    ref, ref_arena = run(decode_attention_reference, spans, mask)
    assert torch.equal(got_arena[0], ref_arena[0]) and torch.equal(got_arena[1], ref_arena[1])
    err = (got.float() - ref.float()).norm() / ref.float().norm()
    assert err < 1e-2, err
    for span in (0, 5, 11):  # alone, and as the only span of a smaller launch
        alone, _ = run(decode_attention, spans[span : span + 1].clone(), mask[span : span + 1].clone())
        rows_of_span = slice(span * num_rows, (span + 1) * num_rows)
        assert torch.equal(alone[rows_of_span], got[rows_of_span]), span


@pytest.mark.gpu
def test_gpu_spans_reading_a_shared_trunk_keep_their_bits(cuda):
    """Five slots of one content (Gemma-3-12B heads): reading the first one's copy of their
    shared 700 rows gives each the bits of reading its own copy; a span alone, the same."""
    num_rows, capacity, trunk = 8, 1024, 700
    spans, mask = _gemma_spans(cuda, num_rows, capacity, num_spans=5)
    spans[:, 2] = torch.tensor([720, 760, 801, 733, 900], dtype=torch.int32)  # first_new past the trunk, all live
    spans[:, 3], spans[:, 4] = 0, spans[:, 2] + num_rows
    for span, first_new in enumerate(spans[:, 2].tolist()):
        mask[span, :, first_new:] = False
        mask[span, torch.arange(num_rows), first_new + torch.arange(num_rows)] = True
    rows = 5 * num_rows
    q, k, v = (fresh((rows, h, 256), cuda, seed=30 + h) for h in (16, 8, 8))
    keys, values = (fresh((5, capacity, 8, 256), cuda, seed=s) for s in (31, 32))
    for arena in (keys, values):
        arena[1:, :trunk] = arena[0, :trunk]
    shared = spans.clone()
    shared[:, 5], shared[:, 6] = 0, trunk // BLOCK_N * BLOCK_N

    def run(table, mask):
        out = torch.zeros_like(q)
        decode_attention(q, k, v, keys.clone(), values.clone(), table, mask, num_rows, 256**-0.5, out)
        return out

    own = run(spans, mask)
    got = run(shared, mask)
    assert torch.equal(own, got)
    alone = run(shared[3:4].clone(), mask[3:4].clone())
    assert torch.equal(alone[3 * num_rows : 4 * num_rows], got[3 * num_rows : 4 * num_rows])
