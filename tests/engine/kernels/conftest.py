"""Kernel tests: references on any machine; `gpu`-marked ones need CUDA and fail without it."""

import pytest
import torch


@pytest.fixture
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.fail("this gpu test needs CUDA: run it through the device tool (see benchmarks/README.md)")
    return torch.device("cuda")

