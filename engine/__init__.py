"""The scoring engine: requests in, one response each, in as few forward passes as fit.

    ScoringRequest --Engine.score_batch--> BatchOutput(results=[ScoringResponse | RequestError])

Wings: pipeline/ (prompts -> tokens -> tree -> packed passes -> scores -> responses),
extraction/ (slots decoded over the K/V kept from the read), layers/ and models/ (the model
stacks and their layers), kernels/ (Triton), loading/ (checkpoints, conversion, quantization),
checks/ (parity against transformers) and testing/ (tiny checkpoints). The engine knows no
HTTP and no queue; docs/ARCHITECTURE.md is the map.
"""

from engine.engine import BatchOutput, Engine, EngineConfig, RequestError

__all__ = ["BatchOutput", "Engine", "EngineConfig", "RequestError"]
