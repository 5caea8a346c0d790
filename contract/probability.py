"""Option probabilities from log-probabilities (pure Python: the engine and the API share it).

    logprobs [l_1 .. l_n] --normalise--> p_i = exp(l_i) / sum_j exp(l_j)
                          --residual-->  max(0, 1 - sum_i exp(l_i))
    p, prior [n]          --reweight-->  q_i = (p_i / prior_i) / sum_j (p_j / prior_j)
                                         (contextual: prior = floor_p; batch: the job's mean p)
"""

from __future__ import annotations

import math


def normalise(logprobs: list[float]) -> list[float]:
    """exp(logprob) normalised over the options (a softmax), computed stably."""
    top = max(logprobs)
    weights = [math.exp(lp - top) for lp in logprobs]
    total = sum(weights)
    return [w / total for w in weights]


def residual(logprobs: list[float]) -> float:
    """The probability of continuing with none of the options."""
    return max(0.0, 1.0 - sum(math.exp(lp) for lp in logprobs))


MIN_PRIOR = 1e-12  # a prior this small is clipped so the division stays finite


def reweight(p: list[float], prior: list[float]) -> list[float]:
    """Label-free calibration of one answer: p divided by a per-option prior, renormalised."""
    scaled = [pi / max(qi, MIN_PRIOR) for pi, qi in zip(p, prior, strict=True)]
    total = sum(scaled)
    return [s / total for s in scaled]
