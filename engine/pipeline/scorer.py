"""Turn the scored tokens' log-probabilities into option scores.

    RunnerOutput.target_logprobs + PackedTree --option_logprobs--> [branch][option] logprob
    [option] logprob --normalise--> p        --residual--> residual   (contract/probability.py)

logprob = sum of an option's token log-probabilities after the branch point;
p = exp(logprob) normalised over the query's options (a softmax of the logprobs);
residual = max(0, 1 - sum exp(logprob)): the probability of continuing with none of them.
floor_p is `normalise` of the floor tree's logprobs (its user contents emptied), kept per
FloorKey by engine/pipeline/floors.py; engine/pipeline/responses.py puts the four together.
Sums run in float64, token by token in sequence order, so they do not depend on the pass.
"""

from __future__ import annotations

import torch

from contract.probability import normalise, residual  # noqa: F401 (the scorer's API)
from engine.pipeline.stages import PackedTree


def option_logprobs(tree: PackedTree, target_logprobs: torch.Tensor) -> list[list[float]]:
    """[branch][option] summed log-probabilities for one packed tree."""
    sums = [[0.0] * len(branch.option_ids) for branch in tree.tree.branches]
    num_scored = len(tree.tree.scored_nodes)
    values = target_logprobs[tree.score_start : tree.score_start + num_scored].tolist()
    for value, branch, option in zip(values, tree.tree.scored_branch, tree.tree.scored_option, strict=True):
        sums[branch][option] += value
    return sums
