"""Choosing a calibration method on held-out rows, with the choice itself held out (numpy only).

    raw p [N] + labels y [N]
      --stratified_folds--> fold per row
      --cross_fit(method)--> out-of-fold calibrated p for every candidate method
      --choose_method--> MethodChoice: the method kept (lowest out-of-fold log-loss among those
                         that keep accuracy and AUC), refit on every row (what a pack stores),
                         and its *nested* held-out predictions

Nested: the method reported for a row's held-out prediction was chosen without that row.
For each outer fold f, the whole choice (inner cross-fit of every candidate on the other
folds, eligibility, lowest log-loss) runs on the rows outside f; the method it picks is
fitted on those rows and predicts f. So `held_out_p` and `after` never saw the rows they
are judged on, neither through a map's parameters nor through the method choice.
`choose_among_inputs` does the same when the input itself is a choice (a category's
combine of calibrated or of raw question scores).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from prompt_packs.calibration import Calibrator, auc, binary_metrics, fit, num_flipped

CANDIDATE_METHODS = ("temperature", "platt", "isotonic")
# AUC on cross-fitted rows is the mean of the per-fold AUCs (each fold's rows are ranked by
# one map): pooling rows calibrated by different maps would rank them against each other
# with different maps, and move even a rank-preserving method's AUC. A candidate may not lose
# any AUC ("no lower than before"): isotonic ties that cost some rule isotonic out, while
# temperature and Platt on the raw score keep every fold's ranking and so stay eligible.
AUC_TOLERANCE = 0.0


@dataclass(slots=True)
class MethodChoice:
    method: str  # the chosen method
    calibrator: Calibrator  # the chosen method refit on every row: what goes into the pack
    held_out_p: np.ndarray  # [N] out-of-fold calibrated predictions of the chosen method
    before: dict[str, float]  # metrics of the raw scores on the same rows
    after: dict[str, float]  # metrics of held_out_p
    candidates: dict[str, dict[str, float]]  # out-of-fold metrics of every method tried (all rows)
    num_flipped: int  # rows whose side of 0.5 the chosen method moved (out of fold)
    fold_methods: list[str] = field(default_factory=list)  # nested: the method each outer fold's choice kept


def stratified_folds(y: np.ndarray, num_folds: int, seed: int = 0) -> np.ndarray:
    """Fold index per row; positives and negatives are dealt round-robin after a shuffle."""
    y = np.asarray(y) > 0.5
    rng = np.random.default_rng(seed)
    folds = np.empty(len(y), dtype=int)
    for group in (np.flatnonzero(y), np.flatnonzero(~y)):
        shuffled = rng.permutation(group)
        folds[shuffled] = (np.arange(len(shuffled)) + rng.integers(num_folds)) % num_folds
    return folds


def nested_held_out(outer: np.ndarray, num_folds: int, out: np.ndarray,
                    fit_and_predict: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, str]]) -> list[str]:
    """Fill `out` fold by fold: `fit_and_predict(train rows, held mask)` makes its choice on the
    rows outside outer fold f and predicts f's rows -> (predictions, what it chose); returns what
    each fold (that holds rows) chose, in fold order."""
    chosen = []
    for fold in range(num_folds):
        held = outer == fold
        if not held.any():
            continue
        predicted, choice = fit_and_predict(np.flatnonzero(~held), held)
        out[held] = predicted
        chosen.append(choice)
    return chosen


def fold_auc(p: np.ndarray, y: np.ndarray, folds: np.ndarray) -> float:
    """Mean AUC over the folds that hold both classes (nan if none does)."""
    aucs = [auc(p[folds == f], y[folds == f]) for f in np.unique(folds)]
    aucs = [a for a in aucs if not np.isnan(a)]
    return float(np.mean(aucs)) if aucs else float("nan")


def cross_fit(method: str, p: np.ndarray, y: np.ndarray, folds: np.ndarray, *, test_bias: bool = True) -> np.ndarray:
    """Each row calibrated by a map fitted on the other folds only."""
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    out = np.empty_like(p)
    for fold in np.unique(folds):
        held = folds == fold
        out[held] = fit(method, p[~held], y[~held], test_bias=test_bias).apply(p[held])
    return out


def _select(inputs: dict[str, np.ndarray], y: np.ndarray, reference: np.ndarray, rows: np.ndarray,
            methods: tuple[str, ...], num_folds: int, seed: int, test_bias: bool) -> tuple[tuple[str, str], dict, dict]:
    """The (input, method) kept on these rows, judged by their own out-of-fold predictions:
    the lowest log-loss among the eligible candidates. Eligible: accuracy and AUC kept
    (`keeps_quality`); and a candidate that re-ranks the rows (isotonic, whose ties move
    ranks, or another input than the first) only where its AUC gain over the baseline has a
    bootstrap 95% lower bound above 0 on these rows: a monotone map of the first input
    keeps every fold's ranking, so a re-ranking must pay for itself."""
    y, reference = y[rows], reference[rows]
    folds = stratified_folds(y, num_folds, seed)
    before = binary_metrics(reference, y) | {"auc": fold_auc(reference, y, folds)}
    first = next(iter(inputs))
    order = [(name, m) for m in methods for name in inputs]
    held = {k: cross_fit(k[1], inputs[k[0]][rows], y, folds, test_bias=test_bias) for k in order}
    scores = {k: binary_metrics(q, y) | {"auc": fold_auc(q, y, folds)} for k, q in held.items()}
    draws = np.random.default_rng(seed).integers(0, len(y), size=(GATE_DRAWS, len(y)))

    def ranks_pay(k: tuple[str, str]) -> bool:
        reranks = k[0] != first or k[1] == "isotonic"
        return not reranks or _auc_gain_lower_bound(reference, held[k], y, draws) > 0

    eligible = [k for k in order if keeps_quality(before, scores[k]) and ranks_pay(k)] or [(first, "temperature")]
    best = min(eligible, key=lambda k: scores[k]["log_loss"] if k in scores else np.inf)
    return best, before, scores


GATE_DRAWS = 400  # bootstrap resamples behind "a re-ranking must pay for itself"


def _fast_auc(p: np.ndarray, y: np.ndarray) -> float:
    """Mann-Whitney AUC with average ranks for ties (vectorised; nan with one class)."""
    positive = y > 0.5
    num_pos, num_neg = int(positive.sum()), int((~positive).sum())
    if not num_pos or not num_neg:
        return float("nan")
    _, inverse, counts = np.unique(p, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]
    return float((ranks[positive].sum() - num_pos * (num_pos + 1) / 2.0) / (num_pos * num_neg))


def _auc_gain_lower_bound(before: np.ndarray, after: np.ndarray, y: np.ndarray, draws: np.ndarray) -> float:
    gains = np.array([_fast_auc(after[i], y[i]) - _fast_auc(before[i], y[i]) for i in draws])
    return float(np.nanquantile(gains, 0.025))


def keeps_quality(before: dict[str, float], after: dict[str, float]) -> bool:
    """Accuracy (at 0.5) no lower, and AUC no lower by more than AUC_TOLERANCE."""
    auc_ok = np.isnan(before["auc"]) or after["auc"] >= before["auc"] - AUC_TOLERANCE
    return after["accuracy"] >= before["accuracy"] and auc_ok


def choose_among_inputs(
    inputs: dict[str, np.ndarray],
    y: np.ndarray,
    *,
    methods: tuple[str, ...] = CANDIDATE_METHODS,
    num_folds: int = 5,
    seed: int = 0,
    baseline: np.ndarray | None = None,
    test_bias: bool = True,
) -> tuple[str, MethodChoice]:
    """Pick an input (e.g. "raw" / "calibrated") and a method for it (see `_select`):
    eligible candidates keep out-of-fold accuracy (at 0.5) and AUC no lower than the baseline
    (default: the first input itself); temperature on the first input is the fallback. The
    returned choice's calibrator is refit on every row (what a pack stores); its
    `held_out_p` / `after` are nested (see the module docstring). `test_bias`: every Platt
    fit keeps its bias only where the fit rows support it (calibration.fit_platt); off for
    a map whose output is only another map's input (fit_pack: a category its joint map serves)."""
    y = np.asarray(y, dtype=np.float64)
    inputs = {name: np.asarray(x, dtype=np.float64) for name, x in inputs.items()}
    reference = next(iter(inputs.values())) if baseline is None else np.asarray(baseline, dtype=np.float64)
    (name, method), _, scores = _select(inputs, y, reference, np.arange(len(y)), methods, num_folds, seed, test_bias)
    outer = stratified_folds(y, num_folds, seed + 1)  # outer folds: not the inner ones

    def fit_and_predict(train: np.ndarray, held: np.ndarray) -> tuple[np.ndarray, str]:
        (inner_name, inner_method), _, _ = _select(inputs, y, reference, train, methods, num_folds, seed, test_bias)
        inner_map = fit(inner_method, inputs[inner_name][train], y[train], test_bias=test_bias)
        chosen = f"{inner_method} ({inner_name})" if len(inputs) > 1 else inner_method
        return inner_map.apply(inputs[inner_name][held]), chosen

    nested = np.empty_like(y)
    fold_methods = nested_held_out(outer, num_folds, nested, fit_and_predict)
    suffix = (lambda k: f"{k[1]} ({k[0]})") if len(inputs) > 1 else (lambda k: k[1])
    choice = MethodChoice(
        method=method, calibrator=fit(method, inputs[name], y, test_bias=test_bias), held_out_p=nested,
        before=binary_metrics(reference, y) | {"auc": fold_auc(reference, y, outer)},
        after=binary_metrics(nested, y) | {"auc": fold_auc(nested, y, outer)},
        candidates={suffix(k): v for k, v in scores.items()}, num_flipped=num_flipped(reference, nested),
        fold_methods=fold_methods)
    return name, choice


def choose_method(
    p: np.ndarray,
    y: np.ndarray,
    *,
    methods: tuple[str, ...] = CANDIDATE_METHODS,
    num_folds: int = 5,
    seed: int = 0,
    baseline: np.ndarray | None = None,
) -> MethodChoice:
    """choose_among_inputs with one input: the method for raw scores `p` (nested held out)."""
    return choose_among_inputs({"raw": p}, y, methods=methods, num_folds=num_folds, seed=seed,
                               baseline=baseline)[1]


def is_eligible(choice: MethodChoice) -> bool:
    """Held-out accuracy and AUC no lower than before (AUC within AUC_TOLERANCE)."""
    return keeps_quality(choice.before, choice.after)
