"""When a decoding run lays its passes out again (engine/extraction/decoding.py): a layout that
holds finished slots is kept while its passes fit the budget and a graph, and until held rows
are half of a layout of HELD_ROWS_WORTH_COMPACTING rows or more."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.extraction.decoding import HELD_ROWS_WORTH_COMPACTING, _groups, _span_rows, _wants_new_layout
from engine.layers.ops import SCORE_CHUNK


@dataclass
class _State:
    live: list = field(default_factory=list)

    @property
    def is_done(self) -> bool:
        return not self.live


@dataclass
class _Job:
    """What the layout rule reads of a SlotJob: its live hypotheses."""

    state: _State


def _jobs(live_counts: list[int]) -> list[_Job]:
    return [_Job(_State([object()] * n)) for n in live_counts]


def _finish(jobs: list[_Job], count: int) -> None:
    for job in jobs[:count]:
        job.state.live = []


def test_span_rows_pad_live_rows_and_hold_a_finished_slot_in_one_chunk():
    assert [_span_rows(job) for job in _jobs([1, 5, 8, 9, 0])] == [8, 8, 8, 16, SCORE_CHUNK]


def test_a_small_layout_is_kept_however_many_slots_finish():
    jobs = _jobs([5] * 40)  # 320 rows: under HELD_ROWS_WORTH_COMPACTING
    layout = _groups(jobs, 16384)
    _finish(jobs, 39)
    assert not _wants_new_layout(layout, [j for j in jobs if not j.state.is_done], 16384, 2048)


def test_a_large_layout_is_packed_again_once_half_its_rows_are_held():
    jobs = _jobs([5] * 128)  # 1,024 rows
    assert 128 * 8 >= HELD_ROWS_WORTH_COMPACTING
    layout = _groups(jobs, 16384)
    _finish(jobs, 63)
    assert not _wants_new_layout(layout, [j for j in jobs if not j.state.is_done], 16384, 2048)
    _finish(jobs, 64)
    assert _wants_new_layout(layout, [j for j in jobs if not j.state.is_done], 16384, 2048)


def test_a_layout_is_packed_again_when_a_pass_outgrows_the_budget_or_a_graph():
    jobs = _jobs([5] * 16)  # 128 rows, two passes of 64 under a budget of 64 rows
    layout = _groups(jobs, 64)
    assert [len(group) for group in layout] == [8, 8]
    assert not _wants_new_layout(layout, jobs, 64, 2048)
    jobs[0].state.live = [object()] * 9  # a beam grew past 8 rows: its pass would be 72
    assert _wants_new_layout(layout, jobs, 64, 2048)
    jobs = _jobs([5] * 16)
    assert _wants_new_layout(_groups(jobs, 16384), jobs, 16384, 64)  # 128 rows: more than a graph takes
    assert _wants_new_layout([], jobs, 16384, 2048)  # no layout yet


def test_a_pass_is_padded_to_the_runners_row_multiple():
    """On CUDA with the "blas" decoding matmul a pass's rows are a multiple of its row block
    (no projection pads them again); otherwise of ROW_CHUNK (the CPU's linear blocks)."""
    import torch

    from engine.kernels.matmul import BLAS_BLOCK_ROWS
    from engine.layers.ops import ROW_CHUNK
    from engine.pipeline.runner import ModelRunner

    cuda = ModelRunner(torch.nn.Identity(), torch.device("cuda"), use_decode_graphs=False)
    assert cuda.decoding_matmul == "blas" and cuda.decoding_row_multiple() == BLAS_BLOCK_ROWS
    cuda.decoding_matmul = "tiles"
    assert cuda.decoding_row_multiple() == ROW_CHUNK
    assert ModelRunner(torch.nn.Identity(), torch.device("cpu")).decoding_row_multiple() == ROW_CHUNK
    assert BLAS_BLOCK_ROWS % ROW_CHUNK == 0
