"""Tile configs of the batch-invariant bf16 matmul on the few rows of a decoding pass.

    python3 benchmarks/decode_matmul_options.py [--rows 64,128,320]
        --> benchmarks/results/decode-matmul-options-gemma-3-12b.{json,md} (the commit inside)

A decoding pass (engine/extraction/decoding.py) has tens to hundreds of rows, so the scoring
passes' 128x256 tiles leave most SMs idle on the narrow projections (o_proj, down: N = 3,840,
15 column tiles). For each Gemma-3-12B projection shape and row count this times every
candidate config (CUDA events, median) beside cuBLAS and the time to stream the weight once
at the copy bandwidth measured in the same run (every call reads a weight not in L2: the calls
cycle over copies of it totalling at least COLD_BYTES, as a pass reads each layer's weight
once), marks `matmul.decoding_tiles`'s choice, and says whether the config's output is
bit-identical to the scoring config's (the same K loop per element: a config that is may be
chosen by row count without changing any row's bits; tests/engine/kernels/ guard the one chosen).
Beside them the split-K kernel decoding passes use (engine/kernels/matmul_split_k.py): each
candidate (tiles, parts) timed and checked batch-invariant (a slice of rows alone gives the
bits it has in the full product), `decoding_config`'s own choice marked.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel_bench import bench  # noqa: E402
from result_files import new_result, write_pair  # noqa: E402

from engine.kernels import matmul, matmul_split_k  # noqa: E402

SHAPES = {"qkv": (8192, 3840), "o": (3840, 4096), "gate_up": (30720, 3840), "down": (3840, 15360)}  # name: (N, K)
CONFIGS = [  # (block_m, block_n, block_k, group_m, num_warps, num_stages); the first is the scoring passes'
    (128, 256, 64, 16, 8, 3),
    (128, 128, 64, 8, 8, 4),
    (64, 128, 64, 8, 4, 4),
    (64, 128, 128, 8, 4, 4),
    (64, 64, 128, 8, 4, 4),
    (64, 64, 128, 8, 4, 6),
    (64, 32, 128, 8, 4, 6),
    (64, 256, 64, 8, 4, 4),
    (64, 256, 64, 8, 4, 3),
    (128, 128, 128, 8, 8, 3),
    (64, 128, 64, 8, 4, 6),
    (128, 64, 128, 8, 4, 4),
]

SPLIT_K = [  # (block_m, block_n, block_k, group_m, num_warps, num_stages, parts)
    (64, 128, 64, 8, 4, 4, 2),
    (64, 128, 64, 8, 4, 4, 4),
    (128, 256, 64, 16, 8, 3, 2),
]
COLD_BYTES = 256 << 20  # the weight copies a timing cycles over: 5x the H100's 50 MB L2


def weight_ring(w: torch.Tensor):
    """w and copies of it, cycled without end: COLD_BYTES in all, so no call finds its weight in L2."""
    return itertools.cycle([w] + [w.clone() for _ in range(-(-COLD_BYTES // (w.numel() * w.element_size())) - 1)])


def copy_gbps() -> float:
    """Device-to-device copy of 1 GiB: bytes read + written per second, the memory's traffic
    rate (the bandwidth ceiling a weight read alone streams at)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / bench(lambda: dst.copy_(src)) / 1e9


def rows_for(num_rows: int, gbps: float) -> list[dict]:
    gen = torch.Generator("cuda").manual_seed(num_rows)
    out = []
    for name, (n, k) in SHAPES.items():
        x = torch.randn(num_rows, k, device="cuda", generator=gen).to(torch.bfloat16)
        w = (torch.randn(n, k, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
        ring = weight_ring(w)
        scoring = matmul.matmul(x, w, tiles=matmul.TileConfig(*CONFIGS[0]))
        chosen = dataclasses.astuple(matmul.decoding_tiles(num_rows, n))
        row = {"rows": num_rows, "shape": name, "N": n, "K": k,
               "weight_stream_us": w.numel() * 2 / (gbps * 1e9) * 1e6,  # its bytes read once at the copy's traffic rate
               "cublas_us": bench(lambda: x @ next(ring).t()) * 1e6,
               "blas_blocks_us": bench(lambda: matmul.matmul_blas_blocks(x, next(ring))) * 1e6, "configs": {}}
        for config in dict.fromkeys([*CONFIGS, chosen]):
            tiles = matmul.TileConfig(*config)
            try:
                seconds = bench(lambda t=tiles: matmul.matmul(x, next(ring), tiles=t))
                same = bool(torch.equal(matmul.matmul(x, w, tiles=tiles), scoring))
                row["configs"][str(config)] = {"us": seconds * 1e6, "bits_equal_scoring": same,
                                               "chosen": config == chosen}
            except Exception as error:  # report and go on: one config that does not build must not hide the rest
                row["configs"][str(config)] = {"error": repr(error)[:200]}
        row["split_k"] = split_k_timings(x, w, ring)
        out.append(row)
    return out


def cublas_by_rows(max_rows: int = 1024, step: int = 64) -> list[dict]:
    """cuBLAS alone on each shape at step, 2 step, ... max_rows rows (weights out of L2): what a
    fixed block of rows (matmul.BLAS_BLOCK_ROWS) costs."""
    out = []
    for name, (n, k) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        ring = weight_ring(w)
        x = torch.randn(max_rows, k, device="cuda").to(torch.bfloat16)
        out.append({"shape": name, "us": {rows: bench(lambda r=rows: x[:r] @ next(ring).t()) * 1e6
                                          for rows in range(step, max_rows + 1, step)}})
        del ring, w
    return out


def split_k_timings(x: torch.Tensor, w: torch.Tensor, ring) -> dict:
    """Each SPLIT_K candidate (and decoding_config's choice) on this product: µs and whether
    rows 3..9 alone and row 0 alone keep the bits they have in the full product."""
    chosen = matmul_split_k.decoding_config(w.shape[0], w.shape[1])
    chosen_key = (*dataclasses.astuple(chosen.tiles), chosen.num_parts)
    timings = {}
    for candidate in dict.fromkeys([*SPLIT_K, chosen_key]):
        config = matmul_split_k.SplitKConfig(matmul.TileConfig(*candidate[:6]), candidate[6])
        try:  # a K the parts cannot cut into whole blocks is a ValueError, reported
            seconds = bench(lambda c=config: matmul_split_k.matmul_split_k(x, next(ring), config=c))
            full = matmul_split_k.matmul_split_k(x, w, config=config)
            invariant = all(torch.equal(matmul_split_k.matmul_split_k(x[a:b], w, config=config), full[a:b])
                            for a, b in ((3, 10), (0, 1)))
            timings[str(candidate)] = {"us": seconds * 1e6, "batch_invariant": invariant,
                                       "chosen": candidate == chosen_key}
        except Exception as error:  # report and go on
            timings[str(candidate)] = {"error": repr(error)[:200]}
    return timings


def markdown(result: dict) -> str:
    lines = [f"# Decoding-pass matmul tile configs, {result['gpu']}", "",
             f"commit `{result['commit']}`, {result['date']}, torch {result['torch']}; "
             f"`{result['command']}`; copy bandwidth {result['copy_gbps']:.0f} GB/s (read + write).",
             "Config = (block_m, block_n, block_k, group_m, num_warps, num_stages); the first is the scoring passes'. "
             "µs per call, median of 20, each call's weight not in L2; `=` bits equal the scoring config's, `≠` they"
             " differ; `*` matmul.decoding_tiles's choice for the rows and shape.", ""]
    header = ["rows", "shape", "weight once", "cuBLAS", f"cuBLAS in {matmul.BLAS_BLOCK_ROWS}-row blocks",
              *result["configs"]]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in result["rows"]:
        cells = [str(row["rows"]), row["shape"], f"{row['weight_stream_us']:.0f}", f"{row['cublas_us']:.0f}",
                 f"{row['blas_blocks_us']:.0f}"]
        for config in result["configs"]:
            entry = row["configs"].get(config)
            cells.append("—" if entry is None else "error" if "error" in entry else
                         f"{entry['us']:.0f} {'=' if entry['bits_equal_scoring'] else '≠'}{'*' if entry.get('chosen') else ''}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Split-K (engine/kernels/matmul_split_k.py), config = (block_m, block_n, block_k, group_m, num_warps, "
              "num_stages, parts); µs per call; `i` batch-invariant (rows alone keep their bits), `✗` not; "
              "`*` decoding_config's choice for the shape.", ""]
    candidates = list(dict.fromkeys(key for row in result["rows"] for key in row["split_k"]))
    header = ["rows", "shape", "weight once", "cuBLAS", *candidates]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in result["rows"]:
        cells = [str(row["rows"]), row["shape"], f"{row['weight_stream_us']:.0f}", f"{row['cublas_us']:.0f}"]
        for key in candidates:
            entry = row["split_k"].get(key, {"error": "-"})
            cells.append("—" if "error" in entry else
                         f"{entry['us']:.0f} {'i' if entry['batch_invariant'] else '✗'}{'*' if entry['chosen'] else ''}")
        lines.append("| " + " | ".join(cells) + " |")
    if result.get("cublas_by_rows"):
        counts = list(result["cublas_by_rows"][0]["us"])
        lines += ["", "cuBLAS alone by row count (µs per call, each call's weight out of L2):", "",
                  "| shape | " + " | ".join(map(str, counts)) + " |", "|---|" + "---:|" * len(counts)]
        lines += ["| " + row["shape"] + " | " + " | ".join(f"{row['us'][c]:.0f}" for c in counts) + " |"
                  for row in result["cublas_by_rows"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="64,128,320", help="comma list of row counts (a decoding pass's rows)")
    args = parser.parse_args()
    result = new_result(gpu=torch.cuda.get_device_name(), torch=torch.__version__, model="gemma-3-12b",
                        command="python3 benchmarks/decode_matmul_options.py --rows " + args.rows,
                        configs=[str(c) for c in CONFIGS], copy_gbps=copy_gbps())
    result["rows"] = [row for num_rows in map(int, args.rows.split(",")) for row in rows_for(num_rows, result["copy_gbps"])]
    result["cublas_by_rows"] = cublas_by_rows()
    write_pair(result, markdown(result), "decode-matmul-options", "gemma-3-12b")
    print(markdown(result))


if __name__ == "__main__":
    main()
