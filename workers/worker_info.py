"""What a worker publishes about itself (workers.loop's check-in, read by GET /health and /v1/models).

    device_of(engines, settings) -> "cuda:0" | "cpu" | the configured device
    describe_model(served name, engine) -> {id, aliases, system_fingerprint, max_context_tokens,
        max_num_batched_tokens}
"""

from __future__ import annotations

from contract.settings import Settings


def device_of(engines: dict, settings: Settings) -> str:
    """The device the engines run on ("cuda:0", "cpu"), else the configured one."""
    for engine in engines.values():
        device = getattr(getattr(engine, "runner", None), "device", None)
        if device is not None:
            return str(device)
    return settings.device


def describe_model(name: str, engine) -> dict:
    return {
        "id": name,
        "aliases": sorted({engine.model_name, str(engine.config.model)} - {name}),
        "system_fingerprint": engine.system_fingerprint,
        "max_context_tokens": engine.max_context_tokens,
        "max_num_batched_tokens": engine.config.max_num_batched_tokens,
    }
