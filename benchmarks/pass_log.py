"""Every pass an engine runs, on the wall clock, and which passes scored which tagged rows.

    PassLog(engine) wraps engine.runner.launch and engine.score_batch (nothing else changes):
      per pass: {pass_id, tokens, launch, launched, gpu_start, gpu_end}   (time.time() seconds)
      per tagged row (its last message starts with `[sync-<i>]`), rows that joined a batch too:
        i -> (pass ids, batch end), the last batch that scored it
    summary(passes, start, end): passes in [start, end], the median batch pass time, the time
      the GPU was busy / idle between passes there, the host's launch time per pass; sync lane
      passes (their own CUDA stream, beside a batch pass: `lane`) apart

On CUDA, `gpu_start` / `gpu_end` come from events recorded around each pass's kernels, placed on
the wall clock through a reference event recorded when the log starts (the GPU idle then); on
CPU a pass runs inside its launch, so they are the launch's own times.
"""

from __future__ import annotations

import re
import statistics
import time

import torch

TAG_RE = re.compile(r"\[sync-(\d+)\] ")


class PassLog:
    def __init__(self, engine) -> None:
        self.runner = engine.runner
        self.is_cuda = self.runner.device.type == "cuda"
        self._marks: list[tuple[dict, object, object]] = []
        self.tagged: dict[int, dict] = {}
        if self.is_cuda:
            torch.cuda.synchronize()
            self.reference = torch.cuda.Event(enable_timing=True)
            self.reference.record()
            self.reference_wall = time.time()
        self._wrap_launch()
        self._wrap_score_batch(engine)

    def _wrap_launch(self) -> None:
        launch = self.runner.launch

        def logged(batch):
            row = {"tokens": batch.num_real_tokens, "launch": time.time()}
            before = after = None
            if self.is_cuda:
                before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                before.record()
            launched = launch(batch)
            if self.is_cuda:
                after.record()
            lane = self.is_cuda and torch.cuda.current_stream() != torch.cuda.default_stream()
            row |= {"pass_id": self.runner.num_passes, "launched": time.time(), "lane": lane}
            self._marks.append((row, before, after))
            return launched

        self.runner.launch = logged

    def _wrap_score_batch(self, engine) -> None:
        score_batch = engine.score_batch

        def logged(requests, while_waiting=None, on_result=None, arrivals=None, refill=None):
            items = list(requests)  # the batch's requests, then those that joined it as it ran

            def joining(source):
                def joined():
                    new = source()
                    items.extend(new)
                    return new
                return None if source is None else joined

            output = score_batch(requests, while_waiting, on_result, joining(arrivals), joining(refill))
            ended = time.time()
            for item, pass_ids in zip(items, output.pass_ids, strict=True):
                request = getattr(item, "request", None)  # a compiled request carries its own (an error none)
                match = request is not None and TAG_RE.match(request.messages[-1].content)
                if match:
                    self.tagged[int(match.group(1))] = {"pass_ids": list(pass_ids), "batch_end": ended}
            return output

        engine.score_batch = logged

    def passes(self) -> list[dict]:
        """Every pass so far, with its GPU times (waits for the GPU on CUDA)."""
        if self.is_cuda:
            torch.cuda.synchronize()
        rows = []
        for row, before, after in self._marks:
            if self.is_cuda:
                start = self.reference_wall + self.reference.elapsed_time(before) / 1e3
                end = self.reference_wall + self.reference.elapsed_time(after) / 1e3
            else:
                start, end = row["launch"], row["launched"]
            rows.append(row | {"gpu_start": start, "gpu_end": end})
        return rows


def summary(passes: list[dict], start: float, end: float) -> dict:
    """The passes that ran on the device inside [start, end], and how busy they kept it. Sync
    lane passes (`lane`: on their own stream, beside a batch pass) count in the busy time (the
    union of all passes' intervals) but not in the median pass, which is the batch passes'."""
    inside = [p for p in passes if p["gpu_end"] > start and p["gpu_start"] < end]
    batch = [p for p in inside if not p.get("lane")]
    lane = [p for p in inside if p.get("lane")]
    spans = _union([(max(p["gpu_start"], start), min(p["gpu_end"], end)) for p in inside])
    busy = sum(b - a for a, b in spans)
    gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:])]
    return {
        "num_passes": len(batch),
        "num_lane_passes": len(lane),
        "tokens": sum(p["tokens"] for p in inside),
        "median_pass_s": _median([p["gpu_end"] - p["gpu_start"] for p in batch]),
        "median_lane_pass_s": _median([p["gpu_end"] - p["gpu_start"] for p in lane]),
        "busy_s": busy,
        "window_s": end - start,
        "busy_share": busy / (end - start) if end > start else None,
        "idle_between_passes_s": sum(gaps),
        "idle_per_pass_s": sum(gaps) / max(1, len(batch) - 1),
        "host_launch_per_pass_s": _median([p["launched"] - p["launch"] for p in batch]),
        "host_launch_per_lane_pass_s": _median([p["launched"] - p["launch"] for p in lane]),
    }


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping intervals merged, in order."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
