"""Order averaging for questions that list lettered choices in the prompt.

    LetteredQuestion(id, template with {choices}, choices, orderings="rotations")
      --expand_orderings--> [(Query, Ordering), ...]   one Query per ordering, each a branch
                                                        of the same read of the content
      --engine--> per Query: p over the letters " A", " B", ...
      --combine_orderings--> Combined(probabilities per choice, top, agreement, spread,
                                      per_ordering: each ordering's native result)

Letters stay in place (A, B, C ...); the choices move under them. Ordering k of
"rotations" shows choice (i + k) mod n under letter i, so every choice sits under every
letter once: n orderings. "all" asks every permutation (n! orderings, so at most 4
choices: 24 branches). Each ordering costs one more question branch of roughly the
question's own length, and the question lists every choice, so the tokens read grow with
n * (n * choice length): about options squared.

Definitions (per content):
- probabilities[c] = mean over orderings of p(letter that showed choice c)
- top = argmax of probabilities (first on ties)
- agreement = share of orderings whose own top choice equals `top`
- spread = max over choices of (max - min over orderings of that choice's p): how far the
  orderings disagree on any one choice; 0 when the order does not matter at all.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

from contract.protocol import Query

OrderingMode = Literal["one", "rotations", "all"]
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
MAX_NUM_CHOICES_ALL = 4  # 4! = 24 branches; 5! = 120 is past any sensible cost
CHOICES_MARKER = "{choices}"
ORDERING_SEPARATOR = "~o"  # query id of ordering k > 0: f"{id}~o{k}"; ordering 0 keeps the id


@dataclass(frozen=True, slots=True)
class Ordering:
    query_id: str  # id of the expanded Query
    choice_order: tuple[int, ...]  # choice_order[i] = index of the choice shown under letter i


@dataclass(frozen=True, slots=True)
class Combined:
    probabilities: list[float]  # per choice, in the question's choice order
    top: int  # index of the most probable choice
    agreement: float  # share of orderings whose top choice is `top`
    spread: float  # max over choices of the range of its p across orderings
    per_ordering: list[dict]  # {"query_id", "choice_order", "probabilities" (per choice)}

    def as_dict(self, choice_ids: list[str]) -> dict:
        return {
            "probabilities": dict(zip(choice_ids, self.probabilities, strict=True)),
            "top": choice_ids[self.top],
            "agreement": self.agreement,
            "spread": self.spread,
            "orderings": self.per_ordering,
        }


def choice_orders(num_choices: int, mode: OrderingMode) -> list[tuple[int, ...]]:
    identity = tuple(range(num_choices))
    if mode == "one":
        return [identity]
    if mode == "rotations":
        return [tuple((i + k) % num_choices for i in range(num_choices)) for k in range(num_choices)]
    if mode == "all":
        if num_choices > MAX_NUM_CHOICES_ALL:
            raise ValueError(
                f"orderings: 'all' asks {num_choices}! orderings; use it for at most"
                f" {MAX_NUM_CHOICES_ALL} choices, or 'rotations'"
            )
        return list(itertools.permutations(identity))
    raise ValueError(f"orderings: unknown mode {mode!r}; expected 'one', 'rotations' or 'all'")


def letter_options(num_choices: int, prefix: str = " ") -> list[str]:
    if num_choices > len(LETTERS):
        raise ValueError(f"choices: at most {len(LETTERS)} lettered choices (got {num_choices})")
    return [prefix + letter for letter in LETTERS[:num_choices]]


def render_choices(choices: list[str], choice_order: tuple[int, ...], line_format: str = "{letter}) {text}") -> str:
    lines = [line_format.format(letter=LETTERS[i], text=choices[c]) for i, c in enumerate(choice_order)]
    return "\n".join(lines)


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def expand_orderings(
    query_id: str,
    template: str,
    choices: list[str],
    mode: OrderingMode = "one",
    *,
    letter_prefix: str = " ",
    answer_in: Literal["user", "assistant"] = "user",
) -> list[tuple[Query, Ordering]]:
    """One Query per ordering; `template` holds `{choices}` once and ends with `{?}`."""
    if template.count(CHOICES_MARKER) != 1:
        raise ValueError(f"template: a lettered question holds {CHOICES_MARKER} exactly once")
    options = letter_options(len(choices), letter_prefix)
    expanded = []
    for k, order in enumerate(choice_orders(len(choices), mode)):
        query_id_k = query_id if k == 0 else f"{query_id}{ORDERING_SEPARATOR}{k}"
        text = template.replace(CHOICES_MARKER, _escape(render_choices(choices, order)))
        query = Query(id=query_id_k, template=text, options=options, answer_in=answer_in)
        expanded.append((query, Ordering(query_id=query_id_k, choice_order=order)))
    return expanded


def combine_orderings(orderings: list[Ordering], letter_probs: list[list[float]]) -> Combined:
    """letter_probs[k][i]: p of letter i in ordering k (the engine's `p`, in option order)."""
    if len(orderings) != len(letter_probs) or not orderings:
        raise ValueError("combine_orderings: one list of letter probabilities per ordering")
    num_choices = len(orderings[0].choice_order)
    per_choice: list[list[float]] = []
    for ordering, probs in zip(orderings, letter_probs, strict=True):
        row = [0.0] * num_choices
        for letter, choice in enumerate(ordering.choice_order):
            row[choice] = float(probs[letter])
        per_choice.append(row)
    mean = [sum(row[c] for row in per_choice) / len(per_choice) for c in range(num_choices)]
    top = max(range(num_choices), key=lambda c: (mean[c], -c))
    tops = [max(range(num_choices), key=lambda c: (row[c], -c)) for row in per_choice]
    spread = max(max(row[c] for row in per_choice) - min(row[c] for row in per_choice) for c in range(num_choices))
    return Combined(
        probabilities=mean,
        top=top,
        agreement=sum(t == top for t in tops) / len(tops),
        spread=spread,
        per_ordering=[
            {"query_id": o.query_id, "choice_order": list(o.choice_order), "probabilities": row}
            for o, row in zip(orderings, per_choice, strict=True)
        ],
    )
