"""/openapi.json as the service answers: FastAPI's schema, completed from the routes and settings.

    FastAPI's schema (request models with their limits: maxLength / maxItems from contract LIMITS)
      + the bearer security scheme on every route that takes a key
      + every status a route answers with, each with the error body (ErrorBody), replacing
        FastAPI's own 422 shape (the service's 422 is the error body too):
          401 a route with a key; 413 every POST (admission: body size); 429 POST on the admitted
          paths (queued rows); 404 a route with a path id; 422 a route with a body or parameters;
          and the route's own (EXTRA_STATUSES: 403 S3 grants, 409 conflicts, 504 sync deadline)
      + text bodies: /metrics (Prometheus text), results and file contents (JSONL)
      + the settings' limits a schema can hold: `limit`'s maximum, inline items' maxItems
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi import routing
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from api.deps import require_key
from api.middleware import ADMITTED_PATHS
from contract.settings import Settings

ERROR_BODY = {
    "title": "ErrorBody",
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string", "description": "what to fix"},
            "type": {"type": "string"},
            "param": {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "the field at fault"},
            "code": {"type": "integer"},
            "job_id": {"type": "string", "description": "the job of a sync call (504, an engine's 422)"},
        },
    }},
}
DESCRIPTIONS = {400: "Bad request", 401: "Missing or invalid API key", 403: "The key may not use this S3 location",
                404: "No such object for this key", 409: "Conflict with the object's state",
                413: "Body or item count over a limit", 422: "Invalid request: `param` names the field",
                429: "Queue full: retry after Retry-After seconds",
                503: "A store the service needs (S3) is unavailable: retry after Retry-After seconds", 504: "Not scored within sync_timeout_s: poll the job"}
SYNC_STATUSES = (409, 422, 504)
EXTRA_STATUSES: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/v1/score"): (*SYNC_STATUSES, 404),  # 404/409: priors_from_job
    ("post", "/v1/chat/completions"): SYNC_STATUSES,
    ("post", "/v1/decide"): SYNC_STATUSES,
    ("post", "/v1/decide/shared"): SYNC_STATUSES,
    ("post", "/v1/decisions"): SYNC_STATUSES,
    ("post", "/v1/jobs"): (403, 409, 422),  # 409: Idempotency-Key reused with another body
    ("get", "/v1/jobs/{job_id}/results"): (409, 503),  # 503: S3 unreadable
    ("post", "/v1/batches/{batch_id}/cancel"): (409,),
    ("post", "/v1/batches"): (422,),
    ("post", "/v1/files"): (400,),  # a multipart body that cannot be parsed
}
TEXT_BODIES = {("get", "/metrics"): "text/plain", ("get", "/v1/jobs/{job_id}/results"): "application/jsonl",
               ("get", "/v1/files/{file_id}/content"): "application/jsonl"}
ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}


def install_openapi(app: FastAPI, settings: Settings) -> None:
    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = describe(app, settings)
        return app.openapi_schema

    app.openapi = openapi


def describe(app: FastAPI, settings: Settings) -> dict:
    schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["ErrorBody"] = ERROR_BODY
    components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer",
                                                "description": "an API key (settings.api_keys)"}}
    for context in routing.iter_route_contexts(app.routes):  # included routers' routes too
        route = context.original_route
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        for method in sorted(m.lower() for m in route.methods):
            operation = schema["paths"][context.path_format][method]
            _complete(operation, route, method, settings)
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    _limits(schemas, settings)
    return schema


def _complete(operation: dict, route: APIRoute, method: str, settings: Settings) -> None:
    needs_key = any(dep.call is require_key for dep in route.dependant.dependencies)
    statuses = set(EXTRA_STATUSES.get((method, route.path_format), ()))
    if needs_key:
        operation["security"] = [{"bearer": []}]
        statuses.add(401)
    if method == "post":
        statuses.add(413)
        if route.path_format in ADMITTED_PATHS:
            statuses.add(429)
    if route.dependant.path_params:
        statuses.add(404)
    if route.dependant.body_params or route.dependant.query_params or "422" in operation["responses"]:
        statuses.add(422)
    responses = operation["responses"]
    for status in sorted(statuses):
        responses[str(status)] = {"description": DESCRIPTIONS.get(status, "Error"),
                                  "content": {"application/json": {"schema": ERROR_REF}}}
    media_type = TEXT_BODIES.get((method, route.path_format))
    if media_type is not None:
        responses["200"]["content"] = {media_type: {"schema": {"type": "string"}}}
    for parameter in operation.get("parameters", []):
        if parameter["name"] == "limit" and parameter["in"] == "query":
            parameter["schema"]["maximum"] = settings.max_list_limit


def _limits(schemas: dict, settings: Settings) -> None:
    items = schemas.get("JobCreate", {}).get("properties", {}).get("items")
    for choice in (items or {}).get("anyOf", []):
        if choice.get("type") == "array":
            choice["maxItems"] = settings.max_num_inline_items
