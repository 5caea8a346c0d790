"""Engines of this process: loaded once per model, never reloaded (and never forked after)."""

from __future__ import annotations

from functools import lru_cache

from engine.engine import Engine, EngineConfig


@lru_cache(maxsize=None)
def get_engine(
    model: str, device: str = "auto", max_num_batched_tokens: int = 16384, pack_dirs: tuple[str, ...] = ()
) -> Engine:
    config = EngineConfig(model=model, device=device, max_num_batched_tokens=max_num_batched_tokens,
                          pack_dirs=pack_dirs)
    return Engine(config)
