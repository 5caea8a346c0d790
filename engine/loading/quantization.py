"""Swap a loaded model's projections for quantized weights (the recipes in quantizations/).

    CausalLM (bf16 Linear weights) --quantize_linears_fp8--> Linear.weight = Fp8Weight
                                   --quantize_linears_int8--> Linear.weight = Int8Weight

Every `engine.layers.modules.Linear` inside the decoder layers is quantized: after loading these
are the fused qkv_proj / gate_up_proj (layers/modules.py), so fp8 quantizes each shared input
once per layer, and per-output-channel scales make a fused weight exactly the rows of the
separately quantized ones. Quantize a loaded model, never before loading. The embedding and
the LM head stay in the model dtype (the scores are read from the LM head, and it runs only
at the scored rows, so it costs little). `ops.linear` dispatches on the weight's type.
Quantizing changes the numerics: the engine's system_fingerprint must include the recipe.
"""

from __future__ import annotations

import torch

from engine.kernels.fp8_matmul import quantize_weight
from engine.kernels.int8_weight import quantize_weight_int8
from engine.layers.modules import Linear

FP8_RECIPE = "fp8-e4m3-w:per-channel-a:per-token-v1"  # goes into the system_fingerprint
INT8_RECIPE = "int8-weight-only-per-channel-v1"


def _swap(model: torch.nn.Module, quantize) -> torch.nn.Module:
    for name, module in model.named_modules():
        if isinstance(module, Linear) and name.startswith("model.layers."):
            weight = module.weight.detach()
            del module._parameters["weight"]  # an nn.Parameter slot cannot hold a quantized weight
            module.weight = quantize(weight)
    return model


@torch.no_grad()
def quantize_linears_fp8(model: torch.nn.Module) -> torch.nn.Module:
    return _swap(model, quantize_weight)


@torch.no_grad()
def quantize_linears_int8(model: torch.nn.Module) -> torch.nn.Module:
    return _swap(model, quantize_weight_int8)


QUANTIZATION_RECIPES = {"none": "none", "fp8": FP8_RECIPE, "int8": INT8_RECIPE}
_QUANTIZERS = {"fp8": quantize_linears_fp8, "int8": quantize_linears_int8}


def quantize(model: torch.nn.Module, quantization: str) -> torch.nn.Module:
    """The model with its decoder projections quantized by `quantization` ("none" keeps it)."""
    if quantization not in QUANTIZATION_RECIPES:
        raise ValueError(f"unknown quantization {quantization!r}; one of {sorted(QUANTIZATION_RECIPES)}")
    return model if quantization == "none" else _QUANTIZERS[quantization](model)
