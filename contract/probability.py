"""Option probabilities from log-probabilities (pure Python: the engine and the API share it).

    logprobs [l_1 .. l_n] --normalise--> p_i = exp(l_i) / sum_j exp(l_j)
                          --residual-->  max(0, 1 - sum_i exp(l_i))
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
