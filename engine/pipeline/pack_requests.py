"""Requests that name prompt packs: expand them into queries of the same read, then split.

    ScoringRequest(packs=[{id}]) --expand_request (registry.get, with_packs)-->
        ScoringRequest with the packs' queries appended (ids "pack-id:question-id") + [Pack]
    ... one read, one response ... --split_response--> own results + `packs` (apply_pack)

Pure Python over prompt_packs.registry; the engine calls it from `_compile` and the response
builder, so a pack's questions are branches of the same tree as the request's own queries.
"""

from __future__ import annotations

from contract.protocol import ScoringRequest
from contract.scoring_results import PackResult, QueryResult
from prompt_packs.apply import split_pack_results, with_packs
from prompt_packs.format import Pack
from prompt_packs.registry import PackRegistry, UnknownPackError


class PackRequestError(ValueError):
    """A request whose packs cannot be served; `field` names the part to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def expand_request(request: ScoringRequest, registry: PackRegistry) -> tuple[ScoringRequest, list[Pack]]:
    """The request with every named pack's questions as queries (unchanged when none)."""
    if not request.packs:
        return request, []
    packs = []
    for index, ref in enumerate(request.packs):
        try:
            packs.append(registry.get(ref.id))
        except UnknownPackError as error:
            raise PackRequestError(f"packs[{index}].id", error.message) from None
    try:
        return with_packs(request, packs), packs
    except ValueError as error:  # a request query id that a pack's question also uses
        raise PackRequestError("scoring.queries", f"a query id clashes with a pack's: {error}") from None


def split_response(results: list[QueryResult], packs: list[Pack]) -> tuple[list[QueryResult], list[PackResult] | None]:
    """(the request's own results, each pack's applied output); None when no pack was named."""
    if not packs:
        return results, None
    own, applied = split_pack_results(results, packs)
    return own, [PackResult.model_validate(entry) for entry in applied]
