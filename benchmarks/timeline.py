"""Where one `score_batch` spends its wall clock: CPU head, each pass on the GPU, CPU tail.

    timeline(engine, compiled) -> {"wall_s", "passes": [{cpu_launch_s, cpu_launched_s,
        gpu_start_s, gpu_end_s, tokens}], "head_s", "tail_s", "gpu_busy_s", "gpu_idle_s"}

Every time is seconds after `score_batch` was called. GPU times come from CUDA events
recorded just before and after each pass's kernels are queued (so `gpu_start_s` is when the
GPU reached the pass, `gpu_end_s` when it finished it), placed on the wall clock through a
reference event recorded at the start. head = until the first pass starts on the GPU;
tail = after the last pass ends on the GPU; idle = gaps between passes.
"""

from __future__ import annotations

import time

import torch


def timeline(engine, compiled) -> dict:
    """One `engine.score_batch(compiled)` (requests already through Engine.compile), timed."""
    runner = engine.runner
    launch = getattr(runner, "_uncounted_launch", runner.launch)
    marks: list[dict] = []

    def marked(batch):
        before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        row = {"cpu_launch_s": time.perf_counter() - start, "tokens": batch.num_real_tokens}
        before.record()
        launched = launch(batch)
        after.record()
        row["cpu_launched_s"] = time.perf_counter() - start
        marks.append((row, before, after))
        return launched

    torch.cuda.synchronize()
    reference = torch.cuda.Event(enable_timing=True)
    saved = runner.launch
    runner.launch = marked
    try:
        start = time.perf_counter()
        reference.record()
        engine.score_batch(compiled)
        wall = time.perf_counter() - start
        torch.cuda.synchronize()
    finally:
        runner.launch = saved
    passes = []
    for row, before, after in marks:
        row["gpu_start_s"] = reference.elapsed_time(before) / 1e3
        row["gpu_end_s"] = reference.elapsed_time(after) / 1e3
        passes.append(row)
    busy = sum(p["gpu_end_s"] - p["gpu_start_s"] for p in passes)
    span = passes[-1]["gpu_end_s"] - passes[0]["gpu_start_s"] if passes else 0.0
    return {"wall_s": wall, "passes": passes, "head_s": passes[0]["gpu_start_s"] if passes else wall,
            "tail_s": wall - passes[-1]["gpu_end_s"] if passes else 0.0, "gpu_busy_s": busy, "gpu_idle_s": span - busy}


def brief(line: dict) -> str:
    passes = " ".join(f"[{p['gpu_start_s']:.3f}-{p['gpu_end_s']:.3f} launch {p['cpu_launch_s']:.3f}-{p['cpu_launched_s']:.3f}"
                      f" {p['tokens']} tok]" for p in line["passes"])
    return (f"wall {line['wall_s']:.3f} s: head {line['head_s']:.3f}, gpu busy {line['gpu_busy_s']:.3f},"
            f" idle between passes {line['gpu_idle_s']:.3f}, tail {line['tail_s']:.3f}; passes {passes}")
