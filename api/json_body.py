"""JSON request bodies decoded strictly, before any route sees them (every router's `route_class`).

    body bytes --UTF-8 (strict)--> text --json--> value --every string valid Unicode?--> the route
      a UTF-8 byte order mark         -> 422 "body: starts with a UTF-8 byte order mark ..."
      a byte that is not UTF-8        -> 422 naming its byte offset
      not JSON                        -> 422 naming the byte offset, line and column
      nested too deeply to parse      -> 422 on `body` (the parser's recursion limit, some hundreds of
                                         levels; no request field nests deeper than input_json's 32)
      a lone surrogate (\\ud800 ...)   -> 422 naming the field (`param`), e.g. messages.0.content

A lone surrogate is legal in JSON's escapes but is no Unicode text: it can be neither
tokenized nor written back as UTF-8 (Redis, S3, the JSON of a reply), so it is refused here,
before anything is queued or written. Bodies that are not JSON (multipart uploads) pass as they are.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from fastapi import Request, Response
from fastapi.routing import APIRoute

from api.errors import ApiError
from contract.json_limits import MAX_JSON_DEPTH

_BOM = b"\xef\xbb\xbf"


def _is_surrogate(text: str) -> int:
    """The index of the first lone surrogate in `text`, else -1."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return -1


def find_surrogate(value, path: tuple = ()) -> tuple[tuple, int] | None:
    """(path, character index) of the first string (or key) holding a lone surrogate."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            index = _is_surrogate(item)
            if index >= 0:
                return where, index
        elif isinstance(item, dict):
            for key, child in item.items():
                index = _is_surrogate(key)
                if index >= 0:
                    return where, index
                stack.append((child, (*where, key)))
        elif isinstance(item, list):
            stack.extend((child, (*where, i)) for i, child in reversed(list(enumerate(item))))
    return None


def decode_json_body(raw: bytes):
    """The body's JSON value, or an ApiError (422) that says what to fix and where."""
    if raw.startswith(_BOM):
        raise ApiError(422, "body: starts with a UTF-8 byte order mark (EF BB BF); send the JSON without it",
                       param="body")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        byte = raw[error.start : error.start + 1].hex()
        raise ApiError(422, f"body: not valid UTF-8: byte 0x{byte} at byte offset {error.start} ({error.reason});"
                            " send UTF-8 text", param="body") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        offset = len(text[: error.pos].encode("utf-8"))
        raise ApiError(422, f"body: not valid JSON at byte offset {offset} (line {error.lineno}, column"
                            f" {error.colno}): {error.msg}", param="body") from None
    except RecursionError:
        raise ApiError(422, f"body: JSON nested too deeply to parse; no field of a request nests deeper than"
                            f" {MAX_JSON_DEPTH} levels (an input_json part's data): send a shallower body",
                       param="body") from None
    found = find_surrogate(value)
    if found is not None:
        path, index = found
        param = ".".join(str(part) for part in path) or "body"
        raise ApiError(422, f"{param}: a lone surrogate (an unpaired \\ud800-\\udfff escape) at character {index};"
                            " text must be valid Unicode", param=param)
    return value


class StrictJsonRequest(Request):
    async def json(self):
        if not hasattr(self, "_json"):
            self._json = decode_json_body(await self.body())
        return self._json


class StrictJsonRoute(APIRoute):
    """An APIRoute whose JSON body is decoded by `decode_json_body`."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJsonRequest(request.scope, request.receive))

        return strict_handler
