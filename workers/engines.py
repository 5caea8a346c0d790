"""Engines of this process: built from the settings, loaded once per model, never reloaded
(and never forked after).

    engine_for(model, settings) -> Engine(EngineConfig(model, settings.device,
                                          settings.max_num_batched_tokens, settings.pack_dirs))

Every path that scores for the service takes its engine here: the greedy worker's models
(spinf_jobs.embedded.load_engines), the plain-RQ `run_chunk`, `spinf-jobs score`.
"""

from __future__ import annotations

from functools import cache

from contract.settings import Settings
from engine.engine import Engine, EngineConfig


def engine_for(model: str, settings: Settings) -> Engine:
    """The engine of `model` as `settings` describe it (the same one for the same settings)."""
    return _engine(model, settings.device, settings.max_num_batched_tokens, tuple(str(p) for p in settings.pack_dirs))


@cache
def _engine(model: str, device: str, max_num_batched_tokens: int, pack_dirs: tuple[str, ...]) -> Engine:
    config = EngineConfig(model=model, device=device, max_num_batched_tokens=max_num_batched_tokens,
                          pack_dirs=pack_dirs)
    return Engine(config)


def clear_engines() -> None:
    """Forget the loaded engines (tests that change the settings between engines)."""
    _engine.cache_clear()
