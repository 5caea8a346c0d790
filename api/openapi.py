"""/openapi.json as the service answers: FastAPI's schema, completed from the routes and settings.

    FastAPI's schema (request models with their limits: maxLength / maxItems from contract LIMITS)
      + the bearer security scheme on every route that takes a key
      + every status a route answers with, each with the error body (ErrorBody), replacing
        FastAPI's own 422 shape (the service's 422 is the error body too):
          401 a route with a key; 413 every POST (admission: body size); 429 POST on the admitted
          paths (queued rows); 404 a route with a path id; 422 a route with a body or parameters;
          and the route's own (EXTRA_STATUSES: 403 S3 grants, 409 conflicts, 504 sync deadline)
      + text bodies: /metrics (Prometheus text), results (JSONL), file contents (the bytes uploaded)
      + the settings' limits a schema can hold: `limit`'s maximum, inline items' maxItems
      + closed sets as enums (batch endpoints, upload purpose, pack ids, workloads) and the
        one-of rules (items | input+output, messages | text); the rules no schema states are
        named in tests/reliability/schemathesis_service.py (CROSS_FIELD_RULES)
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi import routing
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from api.deps import require_key, require_scraper
from api.line_endpoints import ENDPOINTS
from api.middleware import ADMITTED_PATHS
from contract.files import UPLOAD_PURPOSES
from contract.settings import Settings
from prompt_packs.orderings import MAX_NUM_CHOICES_ALL

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
DESCRIPTIONS = {400: "Bad request", 401: "Missing or invalid API key", 403: "The key may not do this: an S3 location outside its grants, or an API key on /metrics while a scrape token is set",
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
    ("get", "/v1/jobs/{job_id}/calibration"): (409, 503),  # 503: S3 unreadable
    ("post", "/v1/batches/{batch_id}/cancel"): (409,),
    ("post", "/v1/batches"): (404, 422),  # 404: input_file_id names no file of this key
    ("post", "/v1/files"): (400,),  # a multipart body that cannot be parsed
    ("get", "/metrics"): (403,),  # an API key while a scrape token is set
}
TEXT_BODIES = {("get", "/metrics"): "text/plain", ("get", "/v1/jobs/{job_id}/results"): "application/jsonl",
               ("get", "/v1/files/{file_id}/content"): "application/octet-stream"}  # the bytes uploaded
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
    _choices(schemas, app.state.packs.ids(), list(settings.workloads))
    return schema


def _complete(operation: dict, route: APIRoute, method: str, settings: Settings) -> None:
    needs_key = any(dep.call in (require_key, require_scraper) for dep in route.dependant.dependencies)
    statuses = set(EXTRA_STATUSES.get((method, route.path_format), ()))
    if needs_key:
        operation["security"] = [{"bearer": []}]
        statuses.add(401)
    if method == "post":
        statuses.add(413)
        if route.path_format in ADMITTED_PATHS:
            statuses.add(429)
    if route.dependant.path_params or any(p.name == "after" for p in route.dependant.query_params):
        statuses.add(404)  # no such object for this key (the `after` cursor of a list names one)
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
        if parameter["name"] == "limit" and parameter["in"] == "query":  # a route's own bound (files) stays
            parameter["schema"].setdefault("maximum", settings.max_list_limit)


def _limits(schemas: dict, settings: Settings) -> None:
    items = schemas.get("JobCreate", {}).get("properties", {}).get("items")
    for choice in (items or {}).get("anyOf", []):
        if choice.get("type") == "array":
            choice["maxItems"] = settings.max_num_inline_items


def _choices(schemas: dict, packs: list[str], workloads: list[str]) -> None:
    """The closed sets and the one-of rules a schema can hold, as the request models check them."""
    schemas["BatchCreate"]["properties"]["endpoint"]["enum"] = sorted(ENDPOINTS)
    upload = schemas.get("Body_upload_file_v1_files_post", {}).get("properties", {})
    if "purpose" in upload:
        upload["purpose"]["enum"] = list(UPLOAD_PURPOSES)
    if "file" in upload:  # bytes whatever they spell: the scalars a form part carries as text (a file part or a plain field)
        upload["file"] = {"title": "File", "type": ["string", "number", "boolean"],  # what a form part can carry
                          "contentMediaType": "application/octet-stream",
                          "description": "The file's bytes (batch input: JSONL, checked line by line when a"
                                         " batch is created); a file part, or a plain form field's text"}
    if packs:
        schemas["PackRef"]["properties"]["id"]["enum"] = sorted(packs)
    for name in ("ScoringRequest", "ChatRequest", "JobCreate"):
        named = schemas[name]["properties"]["packs"]  # a pack named twice is refused: each loaded pack once at most
        named["maxItems"] = min(named.get("maxItems", len(packs)), len(packs))
    for name in ("DecideRequest", "DecisionSpec"):  # "all" orderings of at most 4
        schemas[name]["if"] = {"required": ["orderings"], "properties": {"orderings": {"const": "all"}}}
        schemas[name]["then"] = {"properties": {"options": {"maxItems": MAX_NUM_CHOICES_ALL}}}
    for schema in schemas.values():  # /v1/decide's decisions, /v1/decisions' questions
        if "workload" in schema.get("properties", {}):
            named = [{"enum": sorted(workloads)}] if workloads else []
            schema["properties"]["workload"]["anyOf"] = [*named, {"type": "null"}]
    options = schemas["Query"]["properties"]["options"]  # distinct, none empty (whatever the slot)
    options["uniqueItems"] = True
    options["items"]["minLength"] = 1
    schemas["JobItem"]["oneOf"] = [_given("messages", "text"), _given("text", "messages")]
    s3_job = {"required": ["input", "output"], "properties": {
        "input": {"not": {"type": "null"}}, "output": {"not": {"type": "null"}}, "items": {"type": "null"}}}
    schemas["JobCreate"]["oneOf"] = [_given("items", "input", "output"), s3_job]


def _given(field: str, *absent: str) -> dict:
    """`field` given (not null) and each of `absent` left out or null."""
    return {"required": [field], "properties": {field: {"not": {"type": "null"}}} | {
        name: {"type": "null"} for name in absent}}
