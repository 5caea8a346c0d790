"""int8 weights for GPUs without fp8 (A100, L4, consumer cards): weight-only, per output channel.

    w [N, K] --quantize_weight_int8--> Int8Weight(qweight int8 [N, K], scale [N])
    linear: dequantize to the activation dtype, then the batch-invariant bf16 matmul

Halves the weights' memory; the dequantization is elementwise, so the result stays batch
invariant. No speed gain over bf16 (a fused int8 kernel would be the next step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT8_MAX = 127.0


@dataclass(slots=True)
class Int8Weight:
    qweight: torch.Tensor  # [N, K] int8
    scale: torch.Tensor  # [N] fp32

    @property
    def shape(self) -> torch.Size:
        return self.qweight.shape

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.qweight.float() * self.scale[:, None]).to(dtype)


def quantize_weight_int8(w: torch.Tensor) -> Int8Weight:
    scale = w.float().abs().amax(dim=1).clamp_min(1e-8) / INT8_MAX
    qweight = torch.round(w.float() / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return Int8Weight(qweight=qweight.contiguous(), scale=scale.contiguous())
