"""Bounds on free-form JSON values: nesting depth, number of values, serialized bytes.

    value --json_shape(stop past the limits)--> JsonShape(depth, num_values)
    value --json_limit_problem(limits)--> None, or what to fix ("40 levels deep; at most 32")

The walk is iterative (never Python recursion), so a value nested 100,000 levels deep is
measured, not a RecursionError; it stops as soon as a limit is passed. Depth counts
containers: `{}` and `[1]` are 1 level, `{"a": [1]}` is 2. Values count every scalar and
every container, the outermost included. Bytes are those of the compact JSON text the value is
rendered as (UTF-8), measured only once depth and count are within their limits.
"""

from __future__ import annotations

from dataclasses import dataclass

import json

MAX_JSON_DEPTH = 32
MAX_JSON_VALUES = 10_000
MAX_JSON_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class JsonLimits:
    max_depth: int = MAX_JSON_DEPTH
    max_values: int = MAX_JSON_VALUES
    max_bytes: int = MAX_JSON_BYTES

    def describe(self) -> str:
        return (f"at most {self.max_depth} levels of nesting, {self.max_values:,} values (scalars and containers)"
                f" and {self.max_bytes:,} bytes ({self.max_bytes // 1024} KiB) as compact JSON")


INPUT_JSON_LIMITS = JsonLimits()


@dataclass(frozen=True, slots=True)
class JsonShape:
    depth: int  # the deepest container nesting seen (past max_depth: the walk stopped there)
    num_values: int  # values counted (past max_values: the walk stopped there)


def json_shape(value: object, max_depth: int, max_values: int) -> JsonShape:
    """Depth and value count of `value`, the walk stopped once either passes its limit."""
    stack = [(value, 1)]
    deepest = num_values = 0
    while stack:
        item, depth = stack.pop()
        num_values += 1
        if isinstance(item, dict | list | tuple):
            deepest = max(deepest, depth)
            if deepest > max_depth or num_values > max_values:
                break
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
        elif num_values > max_values:
            break
    return JsonShape(deepest, num_values)


def json_limit_problem(value: object, limits: JsonLimits = INPUT_JSON_LIMITS) -> str | None:
    """What makes `value` pass `limits`, naming the limit; None when it is within them."""
    shape = json_shape(value, limits.max_depth, limits.max_values)
    if shape.depth > limits.max_depth:
        return f"nested more than {limits.max_depth} levels deep; give {limits.describe()}"
    if shape.num_values > limits.max_values:
        return f"more than {limits.max_values:,} values; give {limits.describe()}"
    try:
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))
    except (TypeError, ValueError) as error:  # not JSON (a Python caller's value): json names the type
        return f"not a JSON value ({error})"
    if size > limits.max_bytes:
        return f"{size:,} bytes as compact JSON, more than {limits.max_bytes:,}; give {limits.describe()}"
    return None
