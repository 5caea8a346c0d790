"""Calibration without labels: contextual (per row) and batch (per job), numpy only.

    p [N, C]  (each row's p over a query's C options, as the engine returns it)
    floor_p [N, C]  (the same query with the content emptied: the engine's floor)
      --contextual(p, floor_p)--> q [N, C]     q_i ∝ p_i / floor_p_i       (Zhao et al., 2021)
      --batch_priors(p)--> prior [C]           prior_i = mean over rows of p_i
      --batch(p, prior)--> q [N, C]            q_i ∝ p_i / prior_i          (Zhou et al., 2024)

Both renormalise over the query's options. Contextual needs nothing but the row (the floor
is computed with the read); batch needs every row of the set first, so a job's batch
columns are written once the job's rows are all scored. Both divide by a per-option factor
the same for every row of a query, so with two options they move a row's answer only
through that factor: ranks by p_i / p_j never change (AUC is kept), only the threshold does.
"""

from __future__ import annotations

import numpy as np

LABEL_FREE_METHODS = ("contextual", "batch")
MIN_PRIOR = 1e-12  # a floor or prior this small is clipped: the division stays finite


def _renormalise(scaled: np.ndarray) -> np.ndarray:
    return scaled / scaled.sum(axis=-1, keepdims=True)


def divide_by_prior(p: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """q_i ∝ p_i / prior_i, renormalised over the last axis (the options)."""
    p = np.asarray(p, dtype=np.float64)
    return _renormalise(p / np.clip(np.asarray(prior, dtype=np.float64), MIN_PRIOR, None))


def contextual(p: np.ndarray, floor_p: np.ndarray) -> np.ndarray:
    """Each row divided by its own content-free answer (the floor), renormalised."""
    return divide_by_prior(p, floor_p)


def batch_priors(p: np.ndarray) -> np.ndarray:
    """prior_i: the mean of p_i over the rows (axis 0)."""
    return np.asarray(p, dtype=np.float64).mean(axis=0)


def batch(p: np.ndarray, prior: np.ndarray | None = None) -> np.ndarray:
    """Each row divided by the set's mean answer (or a given prior), renormalised."""
    p = np.asarray(p, dtype=np.float64)
    return divide_by_prior(p, batch_priors(p) if prior is None else prior)


def label_free(method: str, p: np.ndarray, floor_p: np.ndarray | None = None,
               prior: np.ndarray | None = None) -> np.ndarray:
    """One of LABEL_FREE_METHODS (or "raw": p renormalised) on [N, C] probabilities."""
    if method == "raw":
        return _renormalise(np.asarray(p, dtype=np.float64))
    if method == "contextual":
        if floor_p is None:
            raise ValueError("contextual calibration needs floor_p")
        return contextual(p, floor_p)
    if method == "batch":
        return batch(p, prior)
    raise ValueError(f"unknown label-free method {method!r}; expected raw or one of {LABEL_FREE_METHODS}")
