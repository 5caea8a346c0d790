"""Where and how the fp8 MLP's act(gate) * up runs, on one pass's MLP shape (GPU).

    python3 benchmarks/gated_act_options.py [--rows 15872] [--hidden 3840] [--intermediate 15360]
      --> benchmarks/results/gated-act-options.json (the commit inside)
      gate_up [rows, 2 x intermediate] bf16 (random) --gated_act_fp8_kernel, per num_warps-->
          e4m3 [rows, intermediate] + scale [rows]; each variant's bits against the shipped launch
      also: gated_act then quantize_rows (the two-kernel path it replaced), and a plain copy of
      gate_up (what the memory system gives for the bytes read), as GB/s of bytes moved.
      x [rows, hidden] e4m3 rows + a random gate_up Fp8Weight --> down_proj's e4m3 rows, two ways:
          unfused: fp8_matmul writes gate_up, gated_act_fp8 (the path above)
          fused: fp8_gate_up_act (the activation in the matmul's epilogue), then quantize_rows
          (per pipeline depth); each timed whole and by kernel, bits against unfused.

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

from engine.kernels import fp8_gate_up, fp8_matmul, gated_act  # noqa: E402
from engine.kernels.matmul import TileConfig  # noqa: E402

NUM_WARPS = (4, 8, 16, 32)


def launch(gate_up: torch.Tensor, num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return gated_act.gated_act_fp8(gate_up, "gelu_pytorch_tanh", num_warps=num_warps)


def epilogue_rows(rows: int, hidden: int, intermediate: int) -> list[dict]:
    """The activation in gate_up's epilogue against its own kernel after the matmul."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(rows, hidden, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(2 * intermediate, hidden, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    weight, (xq, x_scale) = fp8_matmul.quantize_weight(w), fp8_matmul.quantize_rows(x)
    flop = 2 * rows * hidden * 2 * intermediate

    def unfused():
        return launch(fp8_matmul.fp8_matmul(xq, x_scale, weight))

    def act(tiles, one_dot):
        return fp8_gate_up.fp8_gate_up_act(xq, x_scale, weight, "gelu_pytorch_tanh", tiles=tiles, one_dot=one_dot)

    def fused(tiles, one_dot):
        return fp8_matmul.quantize_rows(act(tiles, one_dot))

    want = unfused()
    gate_up = fp8_matmul.fp8_matmul(xq, x_scale, weight)
    y = fp8_gate_up.fp8_gate_up_act(xq, x_scale, weight, "gelu_pytorch_tanh", one_dot=False)
    out = [{"variant": "unfused: fp8_matmul gate_up, then gated_act_fp8", "ms": bench(unfused) * 1e3,
            "matmul_ms": bench(lambda: fp8_matmul.fp8_matmul(xq, x_scale, weight)) * 1e3,
            "activation_ms": bench(lambda: launch(gate_up)) * 1e3}]
    out[0]["matmul_tflops"] = flop / out[0]["matmul_ms"] / 1e9
    base = fp8_gate_up.GATE_UP_TILES
    for one_dot, stages in ((True, base.num_stages), (True, base.num_stages + 1), (False, base.num_stages)):
        tiles = TileConfig(base.block_m, base.block_n, base.block_k, base.group_m, base.num_warps, stages)
        how = "one dot over the [2, I, K] view" if one_dot else "two dots"
        name = f"fused: fp8_gate_up_act ({how}, num_stages={stages}), then quantize_rows"
        try:
            got = fused(tiles, one_dot)
            row = {"variant": name, "ms": bench(lambda t=tiles, o=one_dot: fused(t, o)) * 1e3,
                   "matmul_ms": bench(lambda t=tiles, o=one_dot: act(t, o)) * 1e3,
                   "activation_ms": bench(lambda: fp8_matmul.quantize_rows(y)) * 1e3,
                   "bit_identical": bool(torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
                                         and torch.equal(got[1], want[1]))}
            row["matmul_tflops"] = flop / row["matmul_ms"] / 1e9
        except Exception as error:  # a launch the compiler refuses (shared memory, layouts) is reported
            row = {"variant": name, "error": repr(error)[:300]}
        out.append(row)
    for row in out:
        print(row, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=15872)
    parser.add_argument("--hidden", type=int, default=3840)
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
    result["hidden"] = args.hidden
    result["gate_up_epilogue"] = epilogue_rows(args.rows, args.hidden, args.intermediate)
    write_json(result, "gated-act-options")


if __name__ == "__main__":
    main()
