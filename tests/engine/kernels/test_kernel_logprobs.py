import pytest
import torch
from kernel_inputs import fresh

from engine.kernels.logprobs import option_logprobs, option_logprobs_reference


def test_reference_picks_the_log_softmax_entries():
    logits = fresh((3, 50), dtype=torch.float32, seed=1, scale=4.0)
    rows, tokens = torch.tensor([0, 0, 2]), torch.tensor([4, 49, 0])
    manual = [logits[r, t] - torch.logsumexp(logits[r], 0) for r, t in zip(rows, tokens)]
    torch.testing.assert_close(option_logprobs_reference(logits, rows, tokens), torch.stack(manual))


@pytest.mark.gpu
def test_gpu_option_logprobs_match_and_are_invariant(cuda):
    logits = fresh((300, 262208), cuda, dtype=torch.float32, seed=2, scale=8.0)
    rows = torch.randint(0, 300, (900,), device=cuda)
    tokens = torch.randint(0, 262208, (900,), device=cuda)
    got = option_logprobs(logits, rows, tokens)
    torch.testing.assert_close(got, option_logprobs_reference(logits, rows, tokens), atol=1e-4, rtol=0)
    first = rows < 10
    alone = option_logprobs(logits[:10], rows[first], tokens[first])
    assert torch.equal(alone, got[first])


@pytest.mark.gpu
def test_gpu_runner_log_softmax_matches_torch_and_is_row_local(cuda):
    """The runner's CUDA path (logits - row log-sum-exp) against torch's log-softmax, and a
    row's values alone equal to the same row among 299 others."""
    from engine.pipeline.runner import chunked_log_softmax, gather_logprobs

    logits = fresh((300, 262208), cuda, dtype=torch.float32, seed=3, scale=8.0)
    targets = torch.randint(0, 262208, (300,), device=cuda)
    reference = torch.log_softmax(logits, dim=-1)
    full = chunked_log_softmax(logits)
    torch.testing.assert_close(full, reference, atol=1e-4, rtol=0)
    torch.testing.assert_close(gather_logprobs(logits, targets), reference.gather(1, targets[:, None])[:, 0], atol=1e-4, rtol=0)
    assert torch.equal(chunked_log_softmax(logits[7:15]), full[7:15])
    assert torch.equal(gather_logprobs(logits[7:15], targets[7:15]), gather_logprobs(logits, targets)[7:15])
    in_place = logits.clone()
    assert torch.equal(chunked_log_softmax(in_place, out=in_place), full)
