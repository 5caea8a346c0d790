"""Matmul ceilings and kernel speeds on the GPU (one process, CUDA events, medians).

    python3 benchmarks/kernel_bench.py   --> benchmarks/results/kernels.json (the commit inside)

Measures: cuBLAS bf16 8192^3 (the MFU denominator), torch._scaled_mm fp8 8192^3, our
batch-invariant bf16 kernels (persistent TMA and pointer) and fp8 kernel on 8192^3 and on
the Gemma-3-12B / Qwen3-8B projection shapes at 16,384 rows, and the norm kernels.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from result_files import new_result, write_json  # noqa: E402

from engine.kernels import fp8_matmul, matmul  # noqa: E402
from engine.kernels.rms_norm import rms_norm  # noqa: E402

SHAPES = {  # name: (M, N, K)
    "square8192": (8192, 8192, 8192),
    "gemma12b.qkv": (16384, 8192, 3840),
    "gemma12b.o": (16384, 3840, 4096),
    "gemma12b.gate": (16384, 15360, 3840),
    "gemma12b.down": (16384, 3840, 15360),
    "qwen3_8b.gate": (16384, 12288, 4096),
    "qwen3_8b.down": (16384, 4096, 12288),
}


def bench(fn, reps: int = 20, warmup: int = 5) -> float:
    """Median seconds of fn() over reps, CUDA events, after warm-up."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def peak_tflops(kind: str, n: int = 8192) -> float:
    """Dense n^3 product through the vendor library, on random data: the MFU denominator."""
    gen = torch.Generator("cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", generator=gen).to(torch.bfloat16)
    b = torch.randn(n, n, device="cuda", generator=gen).to(torch.bfloat16)
    if kind == "bf16":
        seconds = bench(lambda: a @ b.t())
    else:
        aq, bq = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        seconds = bench(lambda: torch._scaled_mm(aq, bq.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    return 2 * n**3 / seconds / 1e12


CANDIDATE_TILES = {  # (block_m, block_n, block_k, group_m, num_warps, num_stages)
    "bf16": [(128, 256, 64, 8, 8, 3), (128, 256, 64, 8, 8, 4), (256, 128, 64, 8, 8, 3), (128, 128, 64, 8, 8, 4),
             (128, 128, 64, 8, 4, 4), (128, 256, 64, 16, 8, 3)],
    "fp8": [(128, 256, 128, 8, 8, 3), (128, 128, 128, 8, 8, 4), (256, 128, 128, 8, 8, 3), (128, 256, 64, 8, 8, 4)],
}


def tile_sweep() -> list[dict]:
    """Candidate fixed tile configs on the Gemma-3-12B MLP shape (one is chosen once, then fixed)."""
    rows = []
    m, n, k = SHAPES["gemma12b.gate"]
    gen = torch.Generator("cuda").manual_seed(2)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    wq = fp8_matmul.quantize_weight(w)
    xq, xs = fp8_matmul.quantize_rows(x)
    for kind, configs in CANDIDATE_TILES.items():
        for config in configs:
            tiles = matmul.TileConfig(*config)
            fn = (lambda t=tiles: matmul.matmul(x, w, tiles=t)) if kind == "bf16" else (lambda t=tiles: fp8_matmul.fp8_matmul(xq, xs, wq, tiles=t))
            try:
                seconds = bench(fn, reps=10, warmup=3)
                rows.append({"shape": "sweep.gemma12b.gate", "variant": f"{kind}{config}", "ms": seconds * 1e3, "tflops": 2 * m * n * k / seconds / 1e12})
            except Exception as error:
                rows.append({"shape": "sweep.gemma12b.gate", "variant": f"{kind}{config}", "error": repr(error)[:120]})
    return rows


def kernel_rows() -> list[dict]:
    rows = tile_sweep()
    for name, (m, n, k) in SHAPES.items():
        gen = torch.Generator("cuda").manual_seed(1)
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        w = (torch.randn(n, k, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
        wq = fp8_matmul.quantize_weight(w)
        xq, xs = fp8_matmul.quantize_rows(x)
        variants = {
            "cublas_bf16": lambda: x @ w.t(),
            "ours_bf16_persistent": lambda: matmul.matmul(x, w),
            "ours_bf16_pointer": lambda: matmul.matmul(x, w, is_persistent=False),
            "ours_fp8_gemm_only": lambda: fp8_matmul.fp8_matmul(xq, xs, wq),
            "ours_fp8_with_quant": lambda: fp8_matmul.fp8_linear(x, wq),
            "scaled_mm_fp8_rowwise": lambda: fp8_matmul.fp8_linear_scaled_mm(x, wq),
        }
        for variant, fn in variants.items():
            try:
                seconds = bench(fn)
                rows.append({"shape": name, "variant": variant, "ms": seconds * 1e3, "tflops": 2 * m * n * k / seconds / 1e12})
            except Exception as error:  # report and go on: one broken variant must not hide the rest
                rows.append({"shape": name, "variant": variant, "error": repr(error)[:300]})
        del x, w, wq, xq, xs
    x = torch.randn(16384, 3840, device="cuda").to(torch.bfloat16)
    w = torch.randn(3840, device="cuda").to(torch.bfloat16)
    for variant, fn in {"ours_rms_norm": lambda: rms_norm(x, w, 1e-6, 1.0)}.items():
        seconds = bench(fn)
        rows.append({"shape": "rms_norm16384x3840", "variant": variant, "ms": seconds * 1e3, "GBps": 2 * x.numel() * 2 / seconds / 1e9})
    return rows


def main() -> None:
    result = new_result(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                        peak_bf16_tflops=peak_tflops("bf16"), peak_fp8_tflops=peak_tflops("fp8"))
    result["kernels"] = kernel_rows()
    write_json(result, "kernels")
    print(f"peak bf16 {result['peak_bf16_tflops']:.0f} TFLOP/s, fp8 {result['peak_fp8_tflops']:.0f} TFLOP/s")
    for row in result["kernels"]:
        value = row.get("tflops", row.get("GBps"))
        print(f"{row['shape']:22s} {row['variant']:24s} " + (f"{row['ms']:8.3f} ms {value:7.1f}" if "ms" in row else row["error"]))


if __name__ == "__main__":
    main()
