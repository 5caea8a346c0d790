"""The transformers baselines of benchmarks/throughput.py score what a lone forward scores.

On tiny random models (fp32, CPU; gemma3_text has a 16-token sliding window and logit
softcapping), every (content, question) alone, unpadded, through the HF model's own forward
and its own logits is the reference. hf_naive, hf_prefix and hf_prefix_batched must give its
option log-probs for contents of different lengths (20 to 50 tokens, one under the window:
the trunks are padded), questions of 1 to 6 tokens (padded too), every group size (uneven last
groups) and question-row chunks of 1 row, rows across contents and a group's rows at once.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import hf_baselines
import prefix_batched
import random_models

TOLERANCE = 1e-4  # nats, fp32
TRUNK_LENGTHS = (31, 9, 50, 20, 44)
QUESTION_COUNTS = (3, 5, 2, 4, 1)


@pytest.fixture(scope="module", params=["tiny-gemma3_text", "tiny-qwen3"])
def hf(request):
    return random_models.make_hf_model(request.param, torch.float32, device="cpu")


def _items(num_options=lambda index: 2, seed: int = 0) -> list[hf_baselines.Item]:
    rng = random.Random(seed)

    def tokens(count: int) -> list[int]:
        return [rng.randrange(10, 30000) for _ in range(count)]

    items = []
    for index, (trunk, count) in enumerate(zip(TRUNK_LENGTHS, QUESTION_COUNTS, strict=True)):
        questions = [tokens(rng.randrange(1, 7)) for _ in range(count)]
        items.append(hf_baselines.Item(tokens(trunk), questions, [tokens(num_options(index)) for _ in questions]))
    return items


@torch.inference_mode()
def _alone(hf, items) -> list[list[float]]:
    """Per item, its questions' option log-probs from the whole sequence alone, unpadded."""
    out = []
    for item in items:
        row = []
        for question, options in zip(item.questions, item.options, strict=True):
            logits = hf(input_ids=torch.tensor([item.trunk + question]), logits_to_keep=1).logits[0, -1].float()
            row += torch.log_softmax(logits, dim=-1)[options].tolist()
        out.append(row)
    return out


@pytest.fixture(scope="module")
def alone(hf) -> list[list[float]]:
    return _alone(hf, _items())


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(r) for r in a] == [len(r) for r in b]
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def test_naive_and_prefix_give_each_sequence_alone(hf, alone):
    items = _items()
    naive, _ = hf_baselines.naive_pass(hf, items)
    flat = iter(t.tolist() for t in naive)
    naive_rows = [[x for _ in item.questions for x in next(flat)] for item in items]
    prefix, _ = hf_baselines.prefix_pass(hf, items)
    assert _max_diff(naive_rows, alone) < TOLERANCE
    assert _max_diff([t.tolist() for t in prefix], alone) < TOLERANCE


@pytest.mark.parametrize(("group", "chunk"), [(1, 0), (2, 0), (3, 4), (4, 1), (5, 0), (5, 3), (5, 7), (2, 2)])
def test_prefix_batched_gives_each_sequence_alone(hf, alone, group, chunk):
    items = _items()
    out, num_tokens = prefix_batched.prefix_batched_pass(hf, items, group, chunk)
    assert _max_diff([t.tolist() for t in out], alone) < TOLERANCE
    assert num_tokens == sum(len(i.trunk) + sum(map(len, i.questions)) for i in items)


def test_prefix_batched_with_option_counts_that_differ_between_contents(hf):
    """Contents with 2 and 3 options in one question forward: each row keeps its own options."""
    items = _items(num_options=lambda index: 2 + index % 2, seed=1)
    out, _ = prefix_batched.prefix_batched_pass(hf, items, 5, 6)
    prefix, _ = hf_baselines.prefix_pass(hf, items)
    assert [len(t) for t in out] == [count * (2 + i % 2) for i, count in enumerate(QUESTION_COUNTS)]
    assert _max_diff([t.tolist() for t in out], [t.tolist() for t in prefix]) < TOLERANCE


def test_group_sizes_double_up_to_every_content():
    assert prefix_batched.group_sizes(24) == [1, 2, 4, 8, 16, 24]
    assert prefix_batched.group_sizes(16) == [1, 2, 4, 8, 16]
    assert prefix_batched.group_sizes(1) == [1]
