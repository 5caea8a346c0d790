"""Typed dependencies: settings, Redis, S3, the caller's API key, the metrics scraper.

    Authorization: Bearer <key> --sha256--> ApiKey (settings) | 401
    GET /metrics: Bearer <scrape token> whose sha256 is metrics_token_sha256 | 401; an API key
      there is a 403 while a scrape token is set, and reads /metrics when none is
The admission middleware runs the same checks before any body is read (api/middleware.py);
the dependencies repeat them for the route (and mark it in the OpenAPI spec).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, Request
from redis import Redis

from api.errors import ApiError
from contract.settings import ApiKey, Settings
from prompt_packs.registry import PackRegistry


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_redis(request: Request) -> Redis:
    return request.app.state.redis


def get_packs(request: Request) -> PackRegistry:
    return request.app.state.packs


def get_s3(request: Request):
    return request.app.state.s3


def _bearer(header: str) -> str | None:
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def authenticate(header: str, keys_by_hash: dict[str, ApiKey]) -> ApiKey:
    """The API key an Authorization header names; 401 when it names none."""
    token = _bearer(header)
    if token is None:
        raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'",
                       headers={"WWW-Authenticate": "Bearer"})
    key = keys_by_hash.get(_sha256(token))
    if key is None:
        raise ApiError(401, "invalid API key", headers={"WWW-Authenticate": "Bearer"})
    return key


def authenticate_scraper(header: str, settings: Settings, keys_by_hash: dict[str, ApiKey]) -> None:
    """GET /metrics: the scrape token when `metrics_token_sha256` is set (401 otherwise, 403
    for an API key), else any API key."""
    if not settings.metrics_token_sha256:
        authenticate(header, keys_by_hash)
        return
    token = _bearer(header)
    if token is not None and hmac.compare_digest(_sha256(token), settings.metrics_token_sha256.lower()):
        return
    if token is not None and _sha256(token) in keys_by_hash:
        raise ApiError(403, "GET /metrics takes the scrape token (metrics_token_sha256), not an API key")
    raise ApiError(401, "missing or invalid scrape token: send 'Authorization: Bearer <scrape token>'",
                   headers={"WWW-Authenticate": "Bearer"})


def require_key(request: Request) -> ApiKey:
    return authenticate(request.headers.get("authorization", ""), request.app.state.keys_by_hash)


def require_scraper(request: Request) -> None:
    state = request.app.state
    authenticate_scraper(request.headers.get("authorization", ""), state.settings, state.keys_by_hash)


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
RedisDep = Annotated[Redis, Depends(get_redis)]
S3Dep = Annotated[object, Depends(get_s3)]
KeyDep = Annotated[ApiKey, Depends(require_key)]
PacksDep = Annotated[PackRegistry, Depends(get_packs)]
ScraperDep = Annotated[None, Depends(require_scraper)]
