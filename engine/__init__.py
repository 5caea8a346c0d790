"""The scoring engine: requests in, one response each, in as few forward passes as fit.

    ScoringRequest --Engine.compile--> CompiledRequest | RequestError
        --Engine.score_batch--> BatchOutput(results=[ScoringResponse | RequestError])

Wings: pipeline/ (prompts -> tokens -> tree -> packed passes -> scores -> responses; the
hand-overs between them in pipeline/stages.py), extraction/ (slots decoded over the K/V kept
from the read), layers/ and models/ (the model stacks and their layers), kernels/ (Triton),
loading/ (checkpoints, conversion, quantization), checks/ (parity against transformers) and
testing/ (tiny checkpoints). The engine knows no HTTP and no queue; docs/ARCHITECTURE.md is
the map.
"""

from engine.engine import Engine, EngineConfig
from engine.pipeline.stages import BatchOutput, CompiledRequest, RequestError

__all__ = ["BatchOutput", "CompiledRequest", "Engine", "EngineConfig", "RequestError"]
