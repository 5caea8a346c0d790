"""Kernel checks run on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1).

The interpreter is chosen when a kernel is decorated, so each check runs in its own
process: `python3 interpreted.py <check>` exits non-zero on a mismatch. `run_interpreted`
is the pytest side. Keep the shapes small: the interpreter runs programs one by one in numpy.
The interpreter converts fp32 -> bf16 by truncation, not round-to-nearest as the GPU does:
bf16 checks here allow an ulp per rounding; fp32 ones are tight. Bit-exact claims are checked
on the GPU (`gpu` marker).
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


def run_interpreted(check: str) -> None:
    """Run `check` (a function of this module) under TRITON_INTERPRET=1; fail on any error.
    Without Triton: fail where it is a dependency (Linux x86_64, as CI), else skip with a reason."""
    try:
        import triton  # noqa: F401
    except ImportError:
        if platform.system() == "Linux" and platform.machine() == "x86_64":
            pytest.fail("triton is a dependency on Linux x86_64 (pyproject.toml) but is not installed")
        pytest.skip("no Triton on this platform: the interpreter checks cannot run")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{HERE}"}
    proc = subprocess.run([sys.executable, str(HERE / "interpreted.py"), check], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def assert_gated_act_close(y, ref, bf16_ulps: int = 1, atol: float = 1e-5) -> None:
    """bf16_ulps ulps of bf16 (1e-5 relative in fp32), or `atol` absolute where gelu's 1 + tanh
    cancels (see gated_act.py)."""
    import torch

    rtol = bf16_ulps * 2**-7 if y.dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(y.float(), ref.float(), rtol=rtol, atol=atol)


def check_gated_act() -> None:
    import torch
    from kernel_inputs import fresh

    from engine.kernels.gated_act import gated_act, gated_act_reference

    for activation in ("gelu_pytorch_tanh", "silu"):
        for dtype in (torch.bfloat16, torch.float32):
            fused = fresh((6, 2 * 1100 + 16), dtype=dtype, seed=1, scale=3.0)
            gate_up = fused[:, : 2 * 1100]  # strided rows, as a slice of a wider buffer
            y = gated_act(gate_up, activation)
            ref = gated_act_reference(gate_up, activation)
            assert y.dtype == dtype and y.shape == (6, 1100)
            assert_gated_act_close(y, ref, bf16_ulps=2)  # two roundings, each truncated here
            assert torch.equal(gated_act(gate_up[2:5], activation), y[2:5])


def check_gated_act_fp8() -> None:
    """The fused kernel against the two kernels it replaces (gated_act, then quantize_rows), bit
    for bit; the interpreter's own e4m3 rounding is not the GPU's (16.0 where torch gives 32.0),
    so the reference comparison lives in the gpu test."""
    import torch
    from kernel_inputs import fresh

    from engine.kernels.fp8_matmul import quantize_rows
    from engine.kernels.gated_act import gated_act, gated_act_fp8

    for activation in ("gelu_pytorch_tanh", "silu"):
        gate_up = fresh((4, 2 * 300 + 8), dtype=torch.float32, seed=2, scale=3.0)[:, :600]
        xq, scale = gated_act_fp8(gate_up, activation)
        want_q, want_scale = quantize_rows(gated_act(gate_up, activation))
        assert xq.dtype == want_q.dtype and xq.shape == (4, 300)
        assert torch.equal(scale, want_scale) and torch.equal(xq.float(), want_q.float())
        assert torch.equal(gated_act_fp8(gate_up[1:3], activation)[0].float(), xq[1:3].float())


def _residual_inputs(dtype):
    """x [5, 200], a strided delta, and (weight, eps, offset) for the norm and the delta's norm."""
    from kernel_inputs import fresh

    x, delta = fresh((5, 200), dtype=dtype, seed=1, scale=3.0), fresh((5, 300), dtype=dtype, seed=2)[:, :200]
    norm, delta_norm = (fresh((200,), dtype=dtype, seed=3), 1e-6, 1.0), (fresh((200,), dtype=dtype, seed=4), 1e-5, 0.0)
    return x, delta, norm, delta_norm


def check_add_rms_norm() -> None:
    import torch

    from engine.kernels.add_rms_norm import add_rms_norm, add_rms_norm_reference

    # fp32: tight. bf16: truncating roundings here (a sum that cancels keeps an operand's ulp)
    for dtype, rtol, atol in ((torch.float32, 1e-5, 1e-5), (torch.bfloat16, 3 * 2**-7, 0.1)):
        x, delta, norm, delta_norm = _residual_inputs(dtype)
        for args in ((norm, delta_norm), (norm, None), (None, delta_norm)):
            got, want = add_rms_norm(x, delta, *args), add_rms_norm_reference(x, delta, *args)
            for g, w in zip(got, want):
                assert (g is None) == (w is None) and (g is None or g.dtype == dtype)
                if g is not None:
                    torch.testing.assert_close(g.float(), w.float(), rtol=rtol, atol=atol)
            assert torch.equal(add_rms_norm(x[1:3], delta[1:3], *args)[0], got[0][1:3])


def check_qk_norm_rope() -> None:
    import torch
    from kernel_inputs import fresh

    from engine.kernels.rms_norm import qk_norm_rope, qk_norm_rope_reference
    from engine.layers import ops

    fused = fresh((6, (4 + 2) * 32), dtype=torch.float32, seed=5, scale=2.0)
    q, w = fused[:, : 4 * 32].view(6, 4, 32), fresh((32,), dtype=torch.float32, seed=6)  # strided rows
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 32, 2).float() / 32))
    cos, sin = ops.rope_cos_sin(torch.arange(6) * 3, inv_freq, torch.float32)
    padded = qk_norm_rope(q, w, cos, sin, 1e-6, 1.0, num_rows_out=10)
    ref = qk_norm_rope_reference(q, w, cos[:, 0], sin[:, 0], 1e-6, 1.0)
    torch.testing.assert_close(padded[:6], ref, rtol=1e-5, atol=1e-5)
    assert padded.shape == (10, 4, 32) and not padded[6:].any()



def same_rows(got, want) -> bool:
    """Fp8Rows `got` and (e4m3, scales) `want`: the same e4m3 bits and the same scales."""
    import torch

    return torch.equal(got.xq.view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(got.scale, want[1])


def check_quantizing_norms() -> None:
    """The quantizing norms (test_kernel_norm_fp8.py) against the unquantized norm kernel then
    quantize_rows_kernel, bit for bit (both interpreted: the same truncation), and row invariant."""
    import torch

    from engine.kernels.add_rms_norm import add_rms_norm
    from engine.kernels.fp8_matmul import Fp8Rows, quantize_rows
    from engine.kernels.rms_norm import rms_norm

    for dtype in (torch.bfloat16, torch.float32):
        x, delta, norm, delta_norm = _residual_inputs(dtype)
        x[3] = 0.0
        delta[3] = 0.0  # an all-zero row: the MIN_AMAX scale
        for dn in (delta_norm, None):
            x_new, h = add_rms_norm(x, delta, norm, dn)
            got_x, got_h = add_rms_norm(x, delta, norm, dn, quantize=True)
            assert isinstance(got_h, Fp8Rows) and got_h.dtype == dtype and got_h.shape == (5, 200)
            assert torch.equal(got_x, x_new) and same_rows(got_h, quantize_rows(h))
            alone = add_rms_norm(x[1:4], delta[1:4], norm, dn, quantize=True)[1]
            assert same_rows(alone, (got_h.xq[1:4], got_h.scale[1:4]))
        rows = rms_norm(x, *norm, quantize=True)
        assert rows.dtype == dtype and same_rows(rows, quantize_rows(rms_norm(x, *norm)))
        assert same_rows(rms_norm(x[2:5], *norm, quantize=True), (rows.xq[2:5], rows.scale[2:5]))

def check_matmul_split_k() -> None:
    """fp32 in and out (the interpreter's bf16 rounding truncates): each parts count against
    the parts summed in order by torch, a bias added once, rows alone keep their bits, `out=`."""
    import torch
    from kernel_inputs import fresh

    from engine.kernels.matmul import TileConfig
    from engine.kernels.matmul_split_k import SplitKConfig, matmul_split_k, matmul_split_k_reference

    tiles = TileConfig(block_m=16, block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2)
    x, w = fresh((37, 128), dtype=torch.float32, seed=1), fresh((72, 128), dtype=torch.float32, seed=2, scale=0.1)
    bias = fresh((72,), dtype=torch.float32, seed=3)
    for parts in (1, 2, 4, 8):
        config = SplitKConfig(tiles, parts)
        for b in (None, bias):
            full = matmul_split_k(x, w, b, config)
            torch.testing.assert_close(full, matmul_split_k_reference(x, w, b, parts), rtol=1e-5, atol=1e-5)
            for start, stop in ((0, 1), (3, 20), (5, 37)):
                assert torch.equal(matmul_split_k(x[start:stop], w, b, config), full[start:stop]), (parts, start, stop)
        out = torch.full((37, 72), float("nan"))
        assert matmul_split_k(x, w, bias, config, out=out) is out and torch.equal(out, matmul_split_k(x, w, bias, config))
    try:
        matmul_split_k(x, w, config=SplitKConfig(tiles, 16))  # 128 columns in 16 parts: not a multiple of block_k
    except ValueError as error:
        assert "multiple" in str(error)
    else:
        raise AssertionError("a K that the parts cannot cut into whole blocks must be refused")


def check_decode_attention() -> None:
    """fp32: the kernel against decode_attention_reference (live spans, a held one, strided
    k/v as views of one q/k/v buffer, G = 2 and G = 1), the arenas written the same, rows
    outside the spans untouched, and a span alone keeps the bits it has among others."""
    import torch
    from kernel_inputs import fresh

    from engine.kernels.decode_attention import decode_attention, decode_attention_reference

    num_rows, capacity, d = 8, 96, 32
    spans = torch.tensor([[0, 2, 20, 0, 28, 2, 0], [8, 0, 88, 88, 96, 0, 0], [24, 3, 50, 0, 58, 3, 0]],
                         dtype=torch.int32)
    gen = torch.Generator().manual_seed(5)
    mask = torch.rand(3, num_rows, capacity, generator=gen) < 0.5
    mask[1] = False  # the held span: its rows see only themselves
    for span, (_, _, first_new, *_) in enumerate(spans.tolist()):
        mask[span, torch.arange(num_rows), first_new + torch.arange(num_rows)] = True
    for num_heads, num_kv_heads in ((4, 2), (2, 2)):
        qkv = fresh((40, (num_heads + 2 * num_kv_heads) * d), dtype=torch.float32, seed=num_heads)
        q = qkv[:, : num_heads * d].reshape(40, num_heads, d).contiguous()
        k = qkv[:, num_heads * d : (num_heads + num_kv_heads) * d].view(40, num_kv_heads, d)  # strided rows
        v = qkv[:, (num_heads + num_kv_heads) * d :].view(40, num_kv_heads, d)
        keys, values = (fresh((4, capacity, num_kv_heads, d), dtype=torch.float32, seed=s) for s in (7, 8))
        args = (q, k, v)

        def run(fn, spans, mask, keys=keys, values=values):
            arena = keys.clone(), values.clone()
            out = torch.full_like(q, float("nan"))
            fn(*args, *arena, spans, mask, num_rows, 0.2, out)
            return out, arena

        got, got_arena = run(decode_attention, spans, mask)
        ref, ref_arena = run(decode_attention_reference, spans, mask)
        assert all(torch.equal(a, b) for a, b in zip(got_arena, ref_arena)), "the arenas are written differently"
        in_spans = torch.cat([torch.arange(s, s + num_rows) for s in (0, 8, 24)])
        torch.testing.assert_close(got[in_spans], ref[in_spans], rtol=1e-5, atol=1e-5)
        outside = torch.ones(40, dtype=torch.bool)
        outside[in_spans] = False
        assert got[outside].isnan().all(), "rows outside the spans were written"
        alone, _ = run(decode_attention, spans[2:].clone(), mask[2:].clone())
        assert torch.equal(alone[24:32], got[24:32]), "a span alone has other bits than among others"
    check_decode_attention_trunk()
    try:
        decode_attention(q, k, v, keys, values, spans.long(), mask, num_rows, 0.2, torch.empty_like(q))
    except ValueError as error:
        assert "int32" in str(error)
    else:
        raise AssertionError("spans that are not int32 must be refused")


def check_decode_attention_trunk() -> None:
    """Spans that share a trunk: keys below trunk_end come from the trunk's entry (the
    follower's own copy of those rows poisoned with NaN does not reach its output), and, where
    the two copies are equal, the outputs are the bits of each span reading its own entry;
    the reference reads the same rows."""
    import torch
    from kernel_inputs import fresh

    from engine.kernels.decode_attention import BLOCK_N, decode_attention, decode_attention_reference

    num_rows, capacity, d, trunk = 8, 3 * BLOCK_N, 32, BLOCK_N + 10  # a trunk of 74 rows: one whole key block
    q, k, v = (fresh((24, h, d), dtype=torch.float32, seed=30 + h) for h in (4, 2, 2))
    keys, values = (fresh((3, capacity, 2, d), dtype=torch.float32, seed=s) for s in (31, 32))
    for arena in (keys, values):
        arena[1:, :trunk] = arena[0, :trunk]  # the siblings' copies of the shared rows
    first_new = [trunk + 20, trunk + 3, trunk + 40]
    mask = torch.rand(3, num_rows, capacity, generator=torch.Generator().manual_seed(33)) < 0.7
    for span, new in enumerate(first_new):
        mask[span, :, new:] = False
        mask[span, torch.arange(num_rows), new + torch.arange(num_rows)] = True

    def table(shared: bool) -> torch.Tensor:
        return torch.tensor([[span * num_rows, span, new, 0, new + num_rows, 0 if shared else span,
                              BLOCK_N if shared else 0] for span, new in enumerate(first_new)], dtype=torch.int32)

    def run(fn, spans, keys=keys, values=values):
        out = torch.full_like(q, float("nan"))
        fn(q, k, v, keys.clone(), values.clone(), spans, mask, num_rows, 0.2, out)
        return out

    own = run(decode_attention, table(False))
    shared = run(decode_attention, table(True))
    assert torch.equal(own, shared), "reading the trunk's copy changed the bits"
    torch.testing.assert_close(shared, run(decode_attention_reference, table(True)), rtol=1e-5, atol=1e-5)
    poisoned_keys, poisoned_values = keys.clone(), values.clone()
    poisoned_keys[1:, :BLOCK_N], poisoned_values[1:, :BLOCK_N] = float("nan"), float("nan")
    assert torch.equal(run(decode_attention, table(True), poisoned_keys, poisoned_values), shared), \
        "the followers read their own copies of the trunk"
    assert run(decode_attention, table(False), poisoned_keys, poisoned_values)[num_rows:].isnan().any(), \
        "the poison is not read without the trunk: the check above proves nothing"
    ignoring = functools.partial(decode_attention, trunks=False)
    assert torch.equal(run(ignoring, table(True)), own)
    assert run(ignoring, table(True), poisoned_keys, poisoned_values)[num_rows:].isnan().any(), \
        "trunks=False still read the trunk's entry"


def check_decode_attention_groups() -> None:
    """DecodeGroup's span table and per-span masks (engine/layers/decode_attention.py) drive
    the kernel to SDPA's outputs (the CPU path of decode_attention, fp32): slots in two
    arenas, live with decoded rows, one held, two that share a trunk (the second reads the
    first's copy of it, SDPA each its own), with and without a sliding window."""
    import torch

    from engine.extraction import kv_cache
    from engine.kernels.decode_attention import BLOCK_N
    from engine.kernels.decode_attention import decode_attention as kernel
    from engine.layers import decode_attention as decode_module

    layers, hq, hkv, d, n = 2, 4, 2, 32, 8
    gen = torch.Generator().manual_seed(9)
    slots = [kv_cache.SlotKV([torch.randn(p, hkv, d, generator=gen) for _ in range(layers)],
                             [torch.randn(p, hkv, d, generator=gen) for _ in range(layers)], torch.arange(p), p)
             for p in (20, 50, 90, 30, 100)]
    trunk = kv_cache.Trunk(80)  # slots 2 and 4: the same first 80 rows
    for part in ("keys", "values"):
        for layer in range(layers):
            getattr(slots[4], part)[layer][: trunk.num_rows] = getattr(slots[2], part)[layer][: trunk.num_rows]
    slots[2].trunk = slots[4].trunk = trunk
    decode_module.SHARED_TRUNKS = True  # this process only (whatever the engine's default)
    store = kv_cache.KVStore()
    for step in range(3):
        store.reserve(slots, [n] * len(slots), [0] * len(slots))
        spans = []
        for index, kv in enumerate(slots):
            if index == 3 and step == 2:  # finished: held in place
                spans.append(decode_module.held_span(n * index, n, kv))
                continue
            real = 1 + index % 3
            own = [list(range(kv.num_prompt_rows, kv.num_rows))] * real
            spans.append(decode_module.DecodeSpan(n * index, n, real, kv, decode_module.decode_mask(kv, own, n),
                                                  torch.full((n,), kv.num_rows), kv.num_rows))
        rows = n * len(slots) + 8
        q, k, v = (torch.randn(rows, h, d, generator=gen) for h in (hq, hkv, hkv))
        for window in (None, 5):
            meta = decode_module.DecodeMetadata(spans)
            assert len(meta.groups) == 2  # capacities 64 and 96 (the slot of 90 rows: 192)
            [table] = [group.spans for group in meta.groups if group.arena is slots[2].arena]
            leader, follower = ((table[:, 1] == slots[index].entry).nonzero()[0, 0] for index in (2, 4))
            assert table[follower, 5] == slots[2].entry and table[follower, 6] == BLOCK_N, table
            assert table[leader, 5] == slots[2].entry
            expected = decode_module.decode_attention(q, k, v, meta, 1, 0.3, window)
            got = torch.zeros_like(q)
            for group in meta.groups:
                kernel(q, k, v, group.arena.keys[1], group.arena.values[1], group.indices(q.device)[-1],
                       group.attention_mask(window, q.device, None), n, 0.3, got)
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        decode_module.SHARED_TRUNKS = False
        [table] = [group.spans for group in decode_module.DecodeMetadata(spans).groups if group.arena is slots[2].arena]
        assert torch.equal(table[:, 5], table[:, 1]) and not table[:, 6].any(), "unshared: every span its own entry"
        decode_module.SHARED_TRUNKS = True
        for span in spans:
            if span.num_real:
                span.kv.positions = torch.cat((span.kv.positions, span.positions[: span.num_real]))


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("run through run_interpreted (TRITON_INTERPRET=1)")
    globals()[f"check_{sys.argv[1]}"]()
