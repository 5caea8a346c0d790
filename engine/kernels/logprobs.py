"""Log-probabilities of the scored tokens: gather the scored rows, log-softmax, pick the options.

    logits [R, V] (fp32, LM head at the scored positions only)
      ──row_logsumexp_kernel (one program per row, fixed V chunks)──> lse [R]
    (rows [S], tokens [S]) ──gather──> logprob[s] = logits[rows[s], tokens[s]] - lse[rows[s]]

Several options are scored from one row (every option's first token follows the branch
point), so the log-sum-exp is taken once per row, not once per option. The row is
reduced in fixed 4,096-wide chunks with an online max, so its bits do not depend on how
many rows share the launch (torch's softmax may change strategy with the shape).
"""

from __future__ import annotations

import torch

from engine.kernels._triton import HAS_TRITON, jit, tl

BLOCK_V = 4096


def option_logprobs_reference(logits: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """logits: [R, V], rows/tokens: [S] int64 -> [S] fp32."""
    return torch.log_softmax(logits.float(), dim=-1)[rows, tokens]


@jit
def row_logsumexp_kernel(logits_ptr, lse_ptr, stride_r, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    run_max = tl.full((BLOCK,), float("-inf"), tl.float32)
    run_sum = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, V, BLOCK):
        x = tl.load(logits_ptr + row * stride_r + start + offs, mask=start + offs < V, other=float("-inf"))
        x = x.to(tl.float32)
        new_max = tl.maximum(run_max, x)
        # Lanes still at -inf (nothing seen yet) keep a zero sum instead of exp(nan).
        scale = tl.where(new_max == float("-inf"), 0.0, tl.exp(run_max - new_max))
        run_sum = run_sum * scale + tl.where(new_max == float("-inf"), 0.0, tl.exp(x - new_max))
        run_max = new_max
    row_max = tl.max(run_max, axis=0)
    total = tl.sum(run_sum * tl.exp(run_max - row_max), axis=0)
    tl.store(lse_ptr + row, row_max + tl.log(total))


def row_logsumexp(logits: torch.Tensor) -> torch.Tensor:
    """logits: [R, V] (last dim contiguous) -> [R] fp32."""
    if not HAS_TRITON:
        raise RuntimeError("row_logsumexp: Triton is not installed")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    if logits.shape[0]:
        row_logsumexp_kernel[(logits.shape[0],)](logits, lse, logits.stride(0), logits.shape[1], BLOCK=BLOCK_V, num_warps=8)
    return lse


def option_logprobs(logits: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Triton version of option_logprobs_reference."""
    lse = row_logsumexp(logits)
    return logits[rows, tokens].float() - lse[rows]
