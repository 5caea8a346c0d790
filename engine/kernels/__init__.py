"""Triton kernels for the CUDA path, each beside its launcher and a torch reference.

    matmul.py       batch-invariant bf16 matmul (persistent, TMA, fixed tiles)  -> ops.linear
    fp8_matmul.py   per-token e4m3 quantization + fp8 matmul with channel scales -> ops.linear(Fp8Weight)
    rms_norm.py     one-program-per-row RMSNorm, fused per-head norm + RoPE     -> ops.rms_norm, ops.norm_rope
    add_rms_norm.py residual add fused with the norms around it (x, h out)      -> ops.add_rms_norm
    gated_act.py    act(gate) * up over the fused gate_up output (GeGLU/SwiGLU)  -> ops.gated_activation
    logprobs.py     per-row log-sum-exp + gather of the scored option tokens

Every module imports on machines without Triton (CI): only the launchers need it.
"""
