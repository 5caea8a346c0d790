"""Compile a scoring request into branches of whole-string token sequences.

    ScoringRequest --compile_request--> CompiledRequest(branches=[Branch per (query, combination)],
        tree=build_tree(branches))

For every (query, combination) the prompt is prefix + filled template, and every option is
scored on `tokenizer(prompt + option)`: the tokens of the whole string, never the
concatenation of separately tokenized parts, because tokenizers merge across the boundary.
The branch point is the longest common token prefix of the prompt and every
prompt + option; an option's logprob covers its tokens from there on.
Floors (the same question with user contents emptied) are branches too, keyed so that
identical floors are computed once (engine/pipeline/floors.py caches them).
An extraction slot ({*} {n} {$}) is a branch with one sequence, its prompt, and no scored
token: the read keeps its K/V and its next-token distribution, and decoding starts there
(engine/extraction/decoding.py). Slots get a floor only when the query asks (`floor: true`).
"""

from __future__ import annotations

from contract.protocol import Query, ScoringRequest
from contract.templates import OPTION_SLOT, expand_grid
from engine.extraction.slots import SlotSpec, slot_spec
from engine.pipeline.prompts import PromptError, PromptRenderer
from engine.pipeline.stages import Branch, CompiledRequest, FloorKey
from engine.pipeline.token_budget import TokenBudget, TokenBudgetExceeded
from engine.pipeline.tokenize import Tokenize
from engine.pipeline.tree import build_tree
from prompt_packs.format import Pack

MIN_OPTIONS_READ_ONCE = 8  # a question with this many options or more,
MIN_CHARS_READ_ONCE = 1024  # and this many characters or more, is tokenized once for all its options


def compile_request(
    request: ScoringRequest, renderer: PromptRenderer, tokenize: Tokenize, packs: list[Pack] | None = None,
    budget: TokenBudget | None = None,
) -> CompiledRequest:
    """`request` with its packs' questions already appended (pack_requests.expand_request); `packs`: those packs.
    `budget`: what tokenizing it may cost (a PromptError on `scoring.queries` past it)."""
    try:
        return _compile(request, renderer, tokenize, packs, budget)
    except TokenBudgetExceeded as error:
        raise PromptError("scoring.queries", str(error)) from None


def _compile(
    request: ScoringRequest, renderer: PromptRenderer, tokenize: Tokenize, packs: list[Pack] | None,
    budget: TokenBudget | None,
) -> CompiledRequest:
    prefixes: dict[tuple[str, bool], str] = {}

    def prefix(answer_in: str, is_floor: bool) -> str:
        if (answer_in, is_floor) not in prefixes:
            prefixes[answer_in, is_floor] = renderer.render_prefix(request.messages, answer_in, is_floor)
        return prefixes[answer_in, is_floor]

    floor_keys: dict[FloorKey, None] = {}
    queries = request.scoring.queries
    pending: dict[str, list[tuple[int, int, dict[str, str], str, list[str], FloorKey]]] = {}
    for query_index, query in enumerate(request.scoring.queries):
        slot = slot_spec(query) if query.slot != OPTION_SLOT else None
        for combination_index, values, filled in _combinations(query):
            floor_key = None
            if slot is None:
                floor_key = FloorKey(prefix(query.answer_in, True), query.answer_in, filled, tuple(query.options))
                floor_keys[floor_key] = None
            item = (query_index, combination_index, values, filled, query.options, floor_key)
            pending.setdefault(query.answer_in, []).append(item)
    branches: list[Branch] = []
    for answer_in, items in pending.items():  # one tokenizer call per rendered prefix
        content = prefix(answer_in, False)
        read_once = [key is not None and _reads_question_once(filled, options) for *_, filled, options, key in items]
        suffixes = [text for (*_, filled, options, _), once in zip(items, read_once, strict=True)
                    for text in (filled, *(() if once else (filled + o for o in options)))]
        token_ids = iter(tokenize.continuations(content, suffixes, budget))
        long_questions = [(filled, options) for (*_, filled, options, _), once in zip(items, read_once) if once]
        option_ids = iter(tokenize.option_continuations(
            content, [filled for filled, _ in long_questions], [options for _, options in long_questions], budget))
        for (q, c, values, filled, options, key), once in zip(items, read_once, strict=True):
            ids = [next(token_ids), *next(option_ids)] if once else [next(token_ids) for _ in range(len(options) + 1)]
            if key is None:
                branches.append(slot_branch(q, c, values, content + filled, ids[0], slot_spec(queries[q])))
            else:
                branches.append(make_branch(q, c, values, content + filled, ids, key))
    branches.sort(key=lambda b: (b.query_index, b.combination_index))
    max_num_tokens = max(len(ids) + (b.slot.max_tokens if b.slot else 0) for b in branches for ids in b.option_ids)
    return CompiledRequest(request, branches, build_tree(branches), max_num_tokens, list(floor_keys), packs or [])


def _reads_question_once(filled: str, options: list[str]) -> bool:
    """A long question with many options: its options are tokenized as continuations of it
    (Tokenize.option_continuations) rather than each with the whole question again."""
    return len(options) >= MIN_OPTIONS_READ_ONCE and len(filled) >= MIN_CHARS_READ_ONCE


def compile_floor(key: FloorKey, tokenize: Tokenize) -> Branch:
    """The floor of one (template, options) as a branch of its own tree."""
    filled, options = key.filled_template, list(key.options)
    if _reads_question_once(filled, options):
        [prompt_ids] = tokenize.continuations(key.empty_prefix, [filled])
        [option_ids] = tokenize.option_continuations(key.empty_prefix, [filled], [options])
        token_ids = [prompt_ids, *option_ids]
    else:
        token_ids = tokenize.continuations(key.empty_prefix, [filled, *(filled + option for option in options)])
    return make_branch(0, 0, {}, key.empty_prefix + key.filled_template, token_ids, None)


def make_branch(
    query_index: int,
    combination_index: int,
    values: dict[str, str],
    prompt: str,
    token_ids: list[list[int]],  # tokens of the prompt, then of prompt + each option
    floor_key: FloorKey | None,
) -> Branch:
    prompt_ids, *option_ids = token_ids
    branch_point = _common_prefix_length(token_ids)
    if branch_point == 0:
        raise PromptError(
            "scoring.queries.template",
            "no token precedes the options: give the template some text before {?}",
        )
    return Branch(query_index, combination_index, values, prompt, option_ids, branch_point, floor_key)


def slot_branch(
    query_index: int, combination_index: int, values: dict[str, str], prompt: str, prompt_ids: list[int], slot: SlotSpec
) -> Branch:
    """An extraction slot: its prompt is read like a question; decoding continues after it."""
    if not prompt_ids:
        raise PromptError("scoring.queries.template", "no token precedes the slot: give the template some text")
    return Branch(query_index, combination_index, values, prompt, [prompt_ids], len(prompt_ids), None, slot)


def _combinations(query: Query):
    parsed = query.parsed_template
    # the grid follows the order of `values` in the request (last name varies fastest)
    for index, values in enumerate(expand_grid(tuple(query.values), query.values)):
        yield index, values, parsed.fill(values)


def _common_prefix_length(sequences: list[list[int]]) -> int:
    """Length of the longest common prefix of all sequences."""
    first = sequences[0]
    return min((_prefix_length(first, other) for other in sequences[1:]), default=len(first))


def _prefix_length(a: list[int], b: list[int]) -> int:
    """Longest common prefix of two lists, by bisection on slice equality (compared in C;
    the prompt's few hundred shared tokens made the token-by-token loop a third of compile)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 1:  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
