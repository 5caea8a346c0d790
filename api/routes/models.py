"""GET /v1/models (OpenAI shape)."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import KeyDep, RedisDep, SettingsDep
from api.served import served_models

router = APIRouter()


@router.get("/v1/models")
def list_models(r: RedisDep, settings: SettingsDep, key: KeyDep) -> dict:
    """Models accepted by this service; `num_workers` 0 means queued until a worker starts."""
    data = [
        {"id": m.id, "object": "model", "created": 0, "owned_by": "spinf-jobs", "num_workers": len(m.workers),
         "aliases": m.aliases, **m.info}
        for m in served_models(r, settings).values()
    ]
    return {"object": "list", "data": data}
