"""Which models the service serves: what live workers published, plus the configured ones.

    spinf:workers (zset name -> last check-in) + spinf:worker:{name} (JSON, TTL)
      -> {model id: ServedModel(info, workers, devices)}; aliases (a checkpoint folder, the
         engine's name) resolve to the id whose queue pair the workers listen on.
    health_problems(models, settings) -> ["model m: no live worker ..."]: the one definition
      of a healthy service (GET /health is 503 with these reasons; none: 200)

A worker is live while its last check-in (a heartbeat every `heartbeat_interval_s`) is at most
`worker_ttl_s` old; a worker that died or hung stops checking in and stops being live.
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
    # one per live worker serving it: worker, device, heartbeat_age_s, pass_fill, rows_per_s
    devices: list[dict] = field(default_factory=list)
    aliases: list[str] = field(default_factory=list)


def live_workers(r: Redis, settings: Settings) -> list[dict]:
    """What each live worker published (name, device, models, rates), with `heartbeat_age_s`."""
    clock = time.time()
    checked_in = r.zrangebyscore(queues.WORKERS_KEY, clock - settings.worker_ttl_s, "+inf", withscores=True)
    if not checked_in:
        return []
    raw = r.mget([queues.worker_key(name.decode()) for name, _ in checked_in])
    workers = []
    for (_, last), item in zip(checked_in, raw, strict=True):
        if item:
            workers.append(orjson.loads(item) | {"heartbeat_age_s": round(max(0.0, clock - last), 3)})
    return workers


def health_problems(models: dict[str, ServedModel], settings: Settings) -> list[str]:
    """Why the service is not healthy: each model it must serve (the default model and
    `models`, less `scale_to_zero_models`) that no live worker serves."""
    required = dict.fromkeys([settings.default_model, *settings.models])
    return [f"model {name!r}: no live worker (none checked in within worker_ttl_s={settings.worker_ttl_s} s)"
            for name in required if name not in settings.scale_to_zero_models and not models[name].workers]


def served_models(r: Redis, settings: Settings) -> dict[str, ServedModel]:
    configured = [settings.default_model, *settings.models, *settings.scale_to_zero_models]
    models = {name: ServedModel(name) for name in configured}
    for worker in live_workers(r, settings):
        for info in worker["models"]:
            model = models.setdefault(info["id"], ServedModel(info["id"]))
            model.info = {k: v for k, v in info.items() if k not in ("id", "aliases")}
            model.workers.append(worker["name"])
            model.devices.append(_device_row(worker))
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


def _device_row(worker: dict) -> dict:
    return {"worker": worker["name"], "device": worker.get("device", "unknown"),
            "heartbeat_age_s": worker["heartbeat_age_s"], "pass_fill": worker.get("pass_fill"),
            "rows_per_s": worker.get("rows_per_s", 0.0)}
