"""Typed dependencies: settings, Redis, S3, the caller's API key.

    Authorization: Bearer <key> --sha256--> ApiKey (settings) | 401
"""

from __future__ import annotations

import hashlib
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


def require_key(request: Request) -> ApiKey:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'",
                       headers={"WWW-Authenticate": "Bearer"})
    key = request.app.state.keys_by_hash.get(hashlib.sha256(token.strip().encode()).hexdigest())
    if key is None:
        raise ApiError(401, "invalid API key", headers={"WWW-Authenticate": "Bearer"})
    return key


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
RedisDep = Annotated[Redis, Depends(get_redis)]
S3Dep = Annotated[object, Depends(get_s3)]
KeyDep = Annotated[ApiKey, Depends(require_key)]
PacksDep = Annotated[PackRegistry, Depends(get_packs)]
