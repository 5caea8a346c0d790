"""Which models the service serves: what live workers published, plus the configured ones.

    spinf:workers (zset name -> last check-in) + spinf:worker:{name} (JSON, TTL)
      -> {model id: ServedModel(info, workers)}; aliases (a checkpoint folder, the engine's
         name) resolve to the id whose queue pair the workers listen on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import orjson
from redis import Redis

from api.errors import ApiError
from contract import queues
from contract.settings import Settings


@dataclass(slots=True)
class ServedModel:
    id: str
    info: dict = field(default_factory=dict)  # fingerprint, limits (empty until a worker serves it)
    workers: list[str] = field(default_factory=list)
    aliases: list[str] = field(default_factory=list)


def live_workers(r: Redis, settings: Settings) -> list[dict]:
    since = time.time() - settings.worker_ttl_s
    names = [name.decode() for name in r.zrangebyscore(queues.WORKERS_KEY, since, "+inf")]
    if not names:
        return []
    raw = r.mget([queues.worker_key(name) for name in names])
    return [orjson.loads(item) for item in raw if item]


def served_models(r: Redis, settings: Settings) -> dict[str, ServedModel]:
    models = {name: ServedModel(name) for name in [settings.default_model, *settings.models]}
    for worker in live_workers(r, settings):
        for info in worker["models"]:
            model = models.setdefault(info["id"], ServedModel(info["id"]))
            model.info = {k: v for k, v in info.items() if k not in ("id", "aliases")}
            model.workers.append(worker["name"])
            model.aliases = sorted(set(model.aliases) | set(info.get("aliases", [])))
    return models


def resolve_model(r: Redis, settings: Settings, requested: str | None) -> str:
    """The served id for a request's `model` (None: the default), or a 422 naming `model`."""
    name = requested or settings.default_model
    models = served_models(r, settings)
    if name in models:
        return name
    for model in models.values():
        if name in model.aliases:
            return model.id
    raise ApiError(422, f"model: unknown model {name!r}; served: {sorted(models)}", param="model")
