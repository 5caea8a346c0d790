"""Joint (multiclass) calibration of an n-way answer: one map over all n probabilities.

    probs [N, C] (a lettered question's choices, or an argmax decision's category scores,
                  renormalised over the C classes) + labels [N] (class index)
      --fit_multiclass("temperature" | "vector")--> MulticlassCalibrator
      --apply--> calibrated [N, C]

On z = log(probs) (probabilities clipped at EPS, then renormalised):
- temperature: q = softmax(z / T), T > 0: one parameter, never changes the argmax or any
  row's ranking of the classes.
- vector: q = softmax(w * z + b), w_c >= 0 and b_c per class (2C parameters, Guo et al.
  2017's vector scaling): can move rows to another class; fitted with a small L2 penalty
  towards the identity (w = 1, b = 0) so a few rows cannot push it far.
Fitted by minimising the log-loss of the true class (golden-section search over log T;
damped Newton steps for vector scaling).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from prompt_packs.calibration import EPS, best_temperature

MULTICLASS_METHODS = ("identity", "temperature", "vector")
VECTOR_L2 = 1e-2


def log_probs(probs: np.ndarray) -> np.ndarray:
    """log of the rows renormalised over the last axis, clipped at EPS."""
    probs = np.clip(np.asarray(probs, dtype=np.float64), EPS, None)
    return np.log(probs / probs.sum(axis=-1, keepdims=True))


def softmax(logits: np.ndarray) -> np.ndarray:
    logits = np.asarray(logits, dtype=np.float64)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


@dataclass(slots=True)
class MulticlassCalibrator:
    method: str  # one of MULTICLASS_METHODS
    params: dict[str, float | list[float]] = field(default_factory=dict)

    def apply(self, probs: np.ndarray | list[float]) -> np.ndarray:
        z = log_probs(probs)
        if self.method == "identity":
            return softmax(z)
        if self.method == "temperature":
            return softmax(z / float(self.params["temperature"]))
        if self.method == "vector":
            return softmax(np.asarray(self.params["w"]) * z + np.asarray(self.params["b"]))
        raise ValueError(f"unknown multiclass method {self.method!r}; expected one of {MULTICLASS_METHODS}")


def multiclass_nll(probs: np.ndarray, labels: np.ndarray) -> float:
    probs = np.asarray(probs, dtype=np.float64)
    return float(-np.mean(np.log(np.clip(probs[np.arange(len(labels)), labels], EPS, None))))


def fit_multiclass_temperature(probs: np.ndarray, labels: np.ndarray) -> MulticlassCalibrator:
    z, labels = log_probs(probs), np.asarray(labels, dtype=int)
    temperature = best_temperature(lambda t: multiclass_nll(softmax(z / t), labels))
    return MulticlassCalibrator("temperature", {"temperature": temperature})


def fit_vector(probs: np.ndarray, labels: np.ndarray, *, l2: float = VECTOR_L2, num_steps: int = 50) -> MulticlassCalibrator:
    """w, b minimising NLL + l2/2 * (|w - 1|^2 + |b|^2), by damped Newton steps."""
    z, labels = log_probs(probs), np.asarray(labels, dtype=int)
    num_rows, num_classes = z.shape
    onehot = np.eye(num_classes)[labels]
    anchor = np.concatenate([np.ones(num_classes), np.zeros(num_classes)])

    def unpack(theta: np.ndarray) -> np.ndarray:
        return theta[:num_classes] * z + theta[num_classes:]

    def loss(theta: np.ndarray) -> float:
        return multiclass_nll(softmax(unpack(theta)), labels) + 0.5 * l2 * float((theta - anchor) @ (theta - anchor))

    theta = anchor.copy()
    for _ in range(num_steps):
        s = softmax(unpack(theta))  # [N, C]
        residual = s - onehot
        grad = np.concatenate([(residual * z).mean(axis=0), residual.mean(axis=0)]) + l2 * (theta - anchor)
        # d logit_nc / d theta: w_c -> z_nc, b_c -> 1; Hessian of the NLL in logits: diag(s) - s s^T
        jac = np.concatenate([z[:, :, None] * np.eye(num_classes), np.broadcast_to(np.eye(num_classes), (num_rows, num_classes, num_classes))], axis=2)
        curvature = s[:, :, None] * np.eye(num_classes) - s[:, :, None] * s[:, None, :]
        hess = np.einsum("nci,ncd,ndj->ij", jac, curvature, jac) / num_rows + l2 * np.eye(2 * num_classes)
        step = np.linalg.solve(hess, grad)
        scale = 1.0
        while loss(theta - scale * step) > loss(theta) and scale > 1e-6:
            scale /= 2.0
        theta -= scale * step
        if np.max(np.abs(scale * step)) < 1e-10:
            break
    weights = np.maximum(theta[:num_classes], 0.0)  # a negative weight would invert a class's evidence
    return MulticlassCalibrator("vector", {"w": weights.tolist(), "b": theta[num_classes:].tolist()})


def fit_multiclass(method: str, probs: np.ndarray, labels: np.ndarray) -> MulticlassCalibrator:
    if method == "identity":
        return MulticlassCalibrator("identity")
    if method == "temperature":
        return fit_multiclass_temperature(probs, labels)
    if method == "vector":
        return fit_vector(probs, labels)
    raise ValueError(f"unknown multiclass method {method!r}; expected one of {MULTICLASS_METHODS}")
