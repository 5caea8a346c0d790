"""Query templates: parse `{?}`, named placeholders, `{{`/`}}` and extraction slots.

    "\\n\\nDoes the message mention {brand}?{?}"
        -> ParsedTemplate(pieces=["\\n\\nDoes the message mention ", Placeholder("brand"), "?"],
                          slot="?")

A template has exactly one slot. The option slot `{?}` must end the template. An
extraction slot (`{*}` text, `{n}` number, `{$}` money) may be followed by text: for `{*}`
that text (the `tail`, e.g. the closing `"` of `A: "{*}"`) is what ends the answer.
Pure Python: no torch, used by the HTTP layer and the engine alike.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

OPTION_SLOT = "?"
TEXT_SLOT = "*"  # free text, ended by the template text after the slot
NUMBER_SLOT = "n"  # a number, parsed
MONEY_SLOT = "$"  # an amount and its currency, parsed
EXTRACTION_SLOTS = (TEXT_SLOT, NUMBER_SLOT, MONEY_SLOT)
ALL_SLOTS = (OPTION_SLOT, *EXTRACTION_SLOTS)

_TOKEN_RE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TemplateError(ValueError):
    """A template that cannot be served; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class Placeholder:
    name: str


@dataclass(frozen=True, slots=True)
class ParsedTemplate:
    pieces: tuple[str | Placeholder, ...]  # text before the slot, literal braces already unescaped
    slot: str  # one of ALL_SLOTS
    tail: str  # text after the slot ("" for the option slot); ends a {*} answer

    @property
    def placeholder_names(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for piece in self.pieces:
            if isinstance(piece, Placeholder):
                seen[piece.name] = None
        return tuple(seen)

    def fill(self, values: dict[str, str]) -> str:
        """The text before the slot with every placeholder replaced."""
        return "".join(values[p.name] if isinstance(p, Placeholder) else p for p in self.pieces)


def parse_template(template: str) -> ParsedTemplate:
    pieces: list[str | Placeholder] = []
    text: list[str] = []
    slot: str | None = None
    tail: list[str] = []
    position = 0
    for match in _TOKEN_RE.finditer(template):
        (tail if slot else text).append(template[position : match.start()])
        position = match.end()
        token = match.group(0)
        if token in ("{{", "}}"):
            (tail if slot else text).append(token[0])
            continue
        if token in ("{", "}"):
            raise TemplateError(
                f"unmatched '{token}' at character {match.start()}: write '{token}{token}' for a literal brace"
            )
        name = match.group(1)
        if name in ALL_SLOTS:
            if slot is not None:
                raise TemplateError(f"two slots ('{{{slot}}}' and '{{{name}}}'): a template has exactly one")
            slot = name
            continue
        if not _NAME_RE.fullmatch(name):
            raise TemplateError(
                f"'{{{name}}}' is neither a slot ({{?}} {{*}} {{n}} {{$}}) nor a placeholder name"
                " (letters, digits, underscore)"
            )
        if slot is not None:
            raise TemplateError(f"placeholder '{{{name}}}' after the slot: placeholders go before it")
        if text:
            pieces.append("".join(text))
            text = []
        pieces.append(Placeholder(name))
    (tail if slot else text).append(template[position:])
    if text and "".join(text):
        pieces.append("".join(text))
    if slot is None:
        raise TemplateError("no slot: end the template with {?} (the options slot)")
    tail_text = "".join(tail)
    if slot == OPTION_SLOT and tail_text:
        raise TemplateError(f"text after {{?}} ({tail_text!r}): the options slot must end the template")
    return ParsedTemplate(pieces=tuple(pieces), slot=slot, tail=tail_text)


def expand_grid(names: tuple[str, ...], values: dict[str, list[str]]) -> list[dict[str, str]]:
    """Cartesian product of the placeholder values, in request order (last name varies fastest)."""
    lists = [values[name] for name in names]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*lists)]
