"""GET /v1/packs: the prompt packs a request can name (official packs/ + `--packs DIR`)."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import KeyDep, PacksDep

router = APIRouter()


@router.get("/v1/packs")
def list_packs(packs: PacksDep, key: KeyDep) -> dict:
    """Every loaded pack: id, version, description, questions, categories, decisions, calibrated ids."""
    return {"object": "list", "data": [{"object": "pack", **summary} for summary in packs.summaries()]}
