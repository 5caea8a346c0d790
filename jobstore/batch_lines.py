"""Batch input lines: one JSONL line -> a call to run, or the error line that replaces it.

    (line number, bytes) --parse_line--> LineCall(line, custom_id, body)
                                       | RefusedLine(custom_id, LineError(code, message, param, line))

Checked in this order, each with its own `code` (docs/batches.md): invalid_json, invalid_line
(not an object, or a key other than custom_id/method/url/body), missing_custom_id,
duplicate_custom_id, invalid_method, invalid_url (not the batch's endpoint), invalid_body
(not an object). The body's own fields are checked by the endpoint's translator after this.

The first line that names a custom_id owns it: a later line naming it again (or a broken line
whose custom_id can be read from its text) is refused with `custom_id` null, so every
custom_id appears once across the output and error files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

from contract.batches import MAX_CUSTOM_ID_CHARS, LineError

LINE_KEYS = ("custom_id", "method", "url", "body")
_CUSTOM_ID_RE = re.compile(rb'"custom_id"\s*:\s*"([^"\\]*)"')


@dataclass(frozen=True, slots=True)
class LineCall:
    line: int  # 1-based line number in the input file
    custom_id: str
    body: dict


@dataclass(frozen=True, slots=True)
class RefusedLine:
    custom_id: str | None
    error: LineError


def refuse(line: int, custom_id: str | None, code: str, message: str, param: str | None = None) -> RefusedLine:
    return RefusedLine(custom_id, LineError(code=code, message=message, param=param, line=line))


def parse_line(line: int, raw: bytes, endpoint: str, seen: set[str]) -> LineCall | RefusedLine:
    """`seen`: the custom_ids owned by earlier lines (this call adds the line's own)."""
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        found = _CUSTOM_ID_RE.search(raw)  # best effort: name the line even when its JSON is broken
        custom_id = _claim(found.group(1).decode(errors="replace"), seen) if found else None
        return refuse(line, custom_id, "invalid_json", f"not valid JSON: {error}")
    if not isinstance(parsed, dict):
        return refuse(line, None, "invalid_line", f"a line is a JSON object, not {type(parsed).__name__}")
    custom_id = parsed.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID_CHARS:
        return refuse(line, None, "missing_custom_id",
                      f"give `custom_id`: a string of 1 to {MAX_CUSTOM_ID_CHARS} characters", "custom_id")
    if _claim(custom_id, seen) is None:
        return refuse(line, None, "duplicate_custom_id",
                      f"custom_id {custom_id!r} is already used by an earlier line; custom_ids must be unique",
                      "custom_id")
    return _check_call(line, custom_id, parsed, endpoint)


def _check_call(line: int, custom_id: str, parsed: dict, endpoint: str) -> LineCall | RefusedLine:
    unknown = sorted(set(parsed) - set(LINE_KEYS))
    if unknown:
        return refuse(line, custom_id, "invalid_line", f"unknown key(s) {unknown}; a line has {list(LINE_KEYS)}",
                      unknown[0])
    if parsed.get("method") != "POST":
        return refuse(line, custom_id, "invalid_method", "method: give \"POST\"", "method")
    if parsed.get("url") != endpoint:
        return refuse(line, custom_id, "invalid_url",
                      f"url: {parsed.get('url')!r} is not this batch's endpoint {endpoint!r}", "url")
    if not isinstance(parsed.get("body"), dict):
        return refuse(line, custom_id, "invalid_body", "body: give the request body as a JSON object", "body")
    return LineCall(line, custom_id, parsed["body"])


def _claim(custom_id: str, seen: set[str]) -> str | None:
    """The custom_id when no earlier line owns it (now this line does), else None."""
    if custom_id in seen:
        return None
    seen.add(custom_id)
    return custom_id
