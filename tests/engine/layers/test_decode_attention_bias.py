"""DecodeGroup.attention_bias (engine/layers/decode_attention.py): the additive bias a decoding
pass hands SDPA, made once per pass, gives SDPA's outputs bit for bit as the bool mask did
(SDPA turns a bool mask into that bias itself, at every call)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernels.decode_attention import SPAN_FIELDS
from engine.layers.decode_attention import DecodeGroup

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _group(num_entries: int, num_rows: int, capacity: int, gen: torch.Generator) -> DecodeGroup:
    """Random masks in which every query sees the key at its own position (as in a decoding
    pass: a row sees itself, a dummy query key 0 at position 0), so every window keeps a key."""
    mask = torch.rand(num_entries, num_rows, capacity, generator=gen) < 0.6
    positions = torch.randint(capacity, (num_entries, num_rows), generator=gen)
    mask.scatter_(2, positions[:, :, None], True)
    key_positions = torch.arange(capacity).expand(num_entries, capacity).clone()
    empty = torch.zeros(0, dtype=torch.long)
    spans = torch.zeros(num_entries, SPAN_FIELDS, dtype=torch.int32)
    spans[:, 1] = torch.arange(num_entries)  # a span in every entry, in entry order
    return DecodeGroup(None, 0, num_entries, num_rows, empty, empty, empty, empty, mask, positions, key_positions,
                       spans)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sliding_window", [None, 40])
def test_bias_gives_the_bool_masks_bits(device, dtype, sliding_window):
    gen = torch.Generator().manual_seed(3)
    b, hkv, g, n, c, d = 5, 2, 2, 8, 96, 64
    group = _group(b, n, c, gen)
    q = torch.randn(b, hkv, g * n, d, generator=gen).to(device, dtype)
    k, v = (torch.randn(b, hkv, c, d, generator=gen).to(device, dtype) for _ in range(2))
    mask = group.attention_mask(sliding_window, torch.device(device), g)
    bias = group.attention_bias(sliding_window, torch.device(device), g, dtype)
    assert bias.dtype == dtype and bias.shape == mask.shape
    assert torch.equal(bias == 0, mask) and torch.equal(bias == -torch.inf, ~mask)
    with_mask = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125)
    with_bias = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.125)
    assert torch.equal(with_mask, with_bias)


def test_bias_is_made_once_per_pass_and_is_no_graph_input():
    """Asked at every layer, the bias is one tensor; the masks a CUDA graph refills are the
    bool ones only (decode_graphs.py reads mask_keys)."""
    group = _group(3, 8, 64, torch.Generator().manual_seed(0))
    cpu = torch.device("cpu")
    first = group.attention_bias(None, cpu, 2, torch.float32)
    assert group.attention_bias(None, cpu, 2, torch.float32) is first
    assert group.mask_keys() == [(None, cpu, 2)]


@pytest.mark.parametrize("window", [40, 64, 65, 1024])
def test_a_window_no_query_reaches_leaves_the_mask_as_it_is(window):
    """host_mask skips the window's arithmetic when every query sits below the window (key
    positions are never negative, so no key is out of it): the same mask either way."""
    gen = torch.Generator().manual_seed(7)
    group = _group(4, 8, 64, gen)  # query positions below 64
    windowed = group.mask & (group.positions[:, :, None] - group.key_positions[:, None, :] < window)
    b, n, c = windowed.shape
    assert torch.equal(group.host_mask(window, None), windowed)  # a span per entry, in entry order
    assert torch.equal(group.host_mask(window, 2),
                       windowed[:, None, None].expand(b, 1, 2, n, c).reshape(b, 1, 2 * n, c))
