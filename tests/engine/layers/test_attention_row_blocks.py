"""CPU tree attention in blocks of query rows (engine.layers.attention.sdpa_in_row_blocks) gives
the bits of one SDPA call over the whole span, for GQA and for a sliding-window mask."""

import pytest
import torch

import engine.layers.attention as attention


@pytest.mark.parametrize("num_rows, window", [(300, None), (257, 40), (5, None)])
def test_row_blocks_give_the_bits_of_one_call(monkeypatch, num_rows, window):
    generator = torch.Generator().manual_seed(num_rows)
    q = torch.randn(num_rows, 4, 16, generator=generator)
    k, v = (torch.randn(num_rows, 2, 16, generator=generator) for _ in range(2))
    mask = torch.ones(num_rows, num_rows, dtype=torch.bool).tril()
    if window is not None:
        rows = torch.arange(num_rows)
        mask &= (rows[:, None] - rows[None, :]) < window
    whole = attention.sdpa(q, k, v, mask, 0.25)
    monkeypatch.setattr(attention, "CPU_SCORES_PER_BLOCK", 4 * num_rows * 7)  # blocks of 7 rows
    blocked = attention.sdpa_in_row_blocks(q, k, v, mask, 0.25)
    assert torch.equal(blocked, whole)
    calls = []
    monkeypatch.setattr(attention, "sdpa", lambda q, *rest: calls.append(q.shape[0]) or whole[: q.shape[0]])
    attention.sdpa_in_row_blocks(q, k, v, mask, 0.25)
    assert max(calls) == min(7, num_rows) and sum(calls) == num_rows  # the scores held at once are bounded
