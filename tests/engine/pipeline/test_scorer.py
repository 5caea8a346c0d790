import math

import torch

from engine.engine import fingerprint
from engine.pipeline.scorer import normalise, residual


def test_normalise_is_a_stable_softmax():
    assert normalise([-1000.0, -1000.0]) == [0.5, 0.5]
    p = normalise([math.log(0.2), math.log(0.6)])
    assert p[0] == 0.25 and abs(p[1] - 0.75) < 1e-15


def test_residual_is_mass_outside_the_options():
    assert abs(residual([math.log(0.3), math.log(0.2)]) - 0.5) < 1e-12
    assert residual([math.log(0.7), math.log(0.6)]) == 0.0  # multi-token options can overlap past 1


def test_fingerprint_moves_with_numerics_only():
    base = fingerprint("abc", torch.float32, torch.device("cpu"))
    assert base == fingerprint("abc", torch.float32, torch.device("cpu"))
    assert base != fingerprint("abd", torch.float32, torch.device("cpu"))
    assert base != fingerprint("abc", torch.bfloat16, torch.device("cpu"))
    assert base != fingerprint("abc", torch.float32, torch.device("cuda"))
