"""CPU passes read their scored rows' log-probs LM-head block by block (runner.cpu_scored_logprobs):
the same bits as the whole [S, V] logits through gather_logprobs / chunked_log_softmax, slots
included, and never more than one block of logits at a time."""

import torch

from engine.layers.ops import SCORE_CHUNK
from engine.pipeline import runner
from engine.pipeline.stages import PackedBatch


class HeadOnly(torch.nn.Module):
    """The LM head of a model (row-chunked linear + softcap), counting the rows it is given."""

    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.weight = torch.randn(vocab, dim, generator=torch.Generator().manual_seed(1))
        self.calls = []

    def head_logits(self, h):
        self.calls.append(h.shape[0])
        logits = torch.cat([torch.nn.functional.linear(h[i:i + SCORE_CHUNK], self.weight)
                            for i in range(0, h.shape[0], SCORE_CHUNK)])
        return torch.tanh(logits / 30.0) * 30.0


def test_blocks_give_the_bits_of_the_whole_logits():
    generator = torch.Generator().manual_seed(0)
    num_rows, vocab = 5 * SCORE_CHUNK, 997
    hidden = torch.randn(num_rows, 32, generator=generator)
    targets = torch.randint(0, vocab, (num_rows,), generator=generator)
    slot_index = torch.tensor([3, 17, 18, 39])
    batch = PackedBatch.__new__(PackedBatch)
    object.__setattr__(batch, "scored_targets", targets)
    object.__setattr__(batch, "slot_index", slot_index)
    model = HeadOnly(vocab, 32)
    blocked, slots = runner.cpu_scored_logprobs(model, hidden, batch)
    assert set(model.calls) == {SCORE_CHUNK}  # one block of logits at a time
    whole = model.head_logits(hidden)
    assert torch.equal(blocked, runner.gather_logprobs(whole, targets))
    assert torch.equal(slots, runner.chunked_log_softmax(whole[slot_index]))
