"""Launch options of the fp8 gated-activation kernel on one pass's MLP shape (GPU).

    python3 benchmarks/gated_act_options.py [--rows 15872] [--intermediate 15360]
      --> benchmarks/results/gated-act-options.json (the commit inside)
      gate_up [rows, 2 x intermediate] bf16 (random) --gated_act_fp8_kernel, per num_warps-->
          e4m3 [rows, intermediate] + scale [rows]; each variant's bits against the shipped launch
      also: gated_act then quantize_rows (the two-kernel path it replaced), and a plain copy of
      gate_up (what the memory system gives for the bytes read), as GB/s of bytes moved.

The row's amax is a max (exact in any order) and the rest is elementwise, so a launch option
may not change a bit; the `bit_identical` column checks that on the GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel_bench import bench  # noqa: E402
from result_files import new_result, write_json  # noqa: E402

from engine.kernels import fp8_matmul, gated_act  # noqa: E402

NUM_WARPS = (4, 8, 16, 32)


def launch(gate_up: torch.Tensor, num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return gated_act.gated_act_fp8(gate_up, "gelu_pytorch_tanh", num_warps=num_warps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=15872)
    parser.add_argument("--intermediate", type=int, default=15360)
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    gate_up = torch.randn(args.rows, 2 * args.intermediate, device="cuda", generator=gen).to(torch.bfloat16)
    moved = gate_up.numel() * 2 + args.rows * args.intermediate + args.rows * 4  # read bf16, write e4m3 + scales
    shipped = launch(gate_up)  # the engine's own launch (gated_act._fp8_num_warps)
    rows = []
    for num_warps in NUM_WARPS:
        try:
            xq, scale = launch(gate_up, num_warps)
            seconds = bench(lambda w=num_warps: launch(gate_up, w))
        except Exception as error:  # a launch the compiler refuses is reported, not fatal
            rows.append({"variant": f"gated_act_fp8 num_warps={num_warps}", "error": repr(error)[:300]})
            print(rows[-1], flush=True)
            continue
        rows.append({"variant": f"gated_act_fp8 num_warps={num_warps}", "ms": seconds * 1e3, "gb_per_s": moved / seconds / 1e9,
                     "bit_identical": bool(torch.equal(xq.view(torch.uint8), shipped[0].view(torch.uint8))
                                           and torch.equal(scale, shipped[1]))})
        print(rows[-1], flush=True)
    seconds = bench(lambda: fp8_matmul.quantize_rows(gated_act.gated_act(gate_up, "gelu_pytorch_tanh")))
    two_kernel_moved = moved + 2 * args.rows * args.intermediate * 2  # + the bf16 y written and read back
    rows.append({"variant": "gated_act then quantize_rows", "ms": seconds * 1e3, "gb_per_s": two_kernel_moved / seconds / 1e9})
    copy = torch.empty_like(gate_up)
    seconds = bench(lambda: copy.copy_(gate_up))
    rows.append({"variant": "copy of gate_up (read + write)", "ms": seconds * 1e3, "gb_per_s": 2 * gate_up.numel() * 2 / seconds / 1e9})
    for row in rows[-2:]:
        print(row, flush=True)
    result = new_result(gpu=torch.cuda.get_device_name(), torch=torch.__version__, rows=args.rows,
                        intermediate=args.intermediate, bytes_moved_fused=moved, variants=rows)
    write_json(result, "gated-act-options")


if __name__ == "__main__":
    main()
