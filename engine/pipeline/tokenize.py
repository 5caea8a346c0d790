"""Whole-string tokenization of many continuations of one prefix, exact and fast.

    (prefix, [suffix, ...]) --Tokenize.continuations--> [tokenizer(prefix + suffix), ...]

    prefix --tokenize once (offsets, word ids)--> cut: token k at char c, safe and checked
    suffix --suffix_cut (once per distinct suffix, cached)--> junction J (suffix[:p]) + tail
        ids (suffix[p:] tokenized alone), when p is a cut no text before the suffix can move
    [prefix[c:] + J + suffix[p], ...] (one per distinct junction) and [prefix[c:] + suffix, ...]
        (suffixes without a cut) --one batched call, no special tokens--> junction / tail ids
    result = (lead special tokens) + prefix_ids[:k] + junction ids + suffix tail ids
           | (lead special tokens) + prefix_ids[:k] + tail             (else: whole strings)

The engine scores exactly `tokenizer(prefix + suffix)`: tokenizers merge across the
boundary, so separately tokenized parts are not enough. But an appended suffix can only
change tokens near the end of the prefix, so the long prefix (a ~500-token article) is
tokenized once and only a short tail of it is tokenized again with each suffix; and the
question suffixes that follow every content are cut once each, their tails kept.

Why each cut gives the whole string's tokens (added tokens, the regex pre-tokenizers of
Qwen2/2.5/3, Llama-3 and GPT-2, Gemma-3's whole-segment BPE), the checks made at run time and
the tests: docs/tokenization.md. Any other tokenizer, or a failed check, gets whole-string
tokenization.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass, field

from engine.pipeline import token_budget
from engine.pipeline.token_budget import TokenBudget, chunks

MIN_PREFIX_CHARS = 256  # shorter prefixes are tokenized whole: a cut would save little
MIN_TAIL_CHARS = 16  # the prefix tail tokenized again with every suffix is at least this long
MAX_NUM_CANDIDATES = 64  # tokens tried, back from the end, before giving up on a cut
MAX_NUM_SUFFIX_CUTS = 16384  # distinct suffixes whose cut and tail ids are kept (oldest dropped)
MAX_SUFFIX_CUT_TOKENS = 1 << 20  # and at most this many tail ids kept, all kept suffixes together
SPACE_PIECE = "\u2581"  # SentencePiece's "▁": Gemma's normaliser writes it for " "
# The pre-tokenizer regexes whose chunk boundaries are known to be stable (docs/tokenization.md).
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_REGEX = QWEN2_REGEX.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
KNOWN_SPLIT_REGEXES = frozenset({QWEN2_REGEX, LLAMA3_REGEX})


@dataclass(frozen=True, slots=True)
class CutRules:
    """Where this tokenizer can be cut (docs/tokenization.md says why each rule is exact)."""

    is_regex: bool  # chunks from a known regex; else BPE over whole segments (Gemma-3)
    is_nfc: bool  # NFC normaliser: a mid-segment cut only before an ASCII char
    lead_ids: tuple[int, ...]  # what add_special_tokens puts before the text (Gemma's BOS)
    added_ids: frozenset[int]  # added tokens split the text before normalisation
    min_tail_chars: int  # longer than any added token: none can straddle the cut
    max_added_chars: int  # the longest added token's text
    added_pieces: frozenset[str]  # every added token's text and its proper tails: no suffix cut where one begins
    backend: object  # the tokenizers.Tokenizer (Gemma's rule reads its vocab, once, lazily)

    def is_safe(self, prefix: str, ids: list[int], offsets: list, words: list, k: int) -> bool:
        """Is the start of token k a cut that no suffix can move?"""
        start = offsets[k][0]
        if k == 0 or not offsets[k - 1][0] < start or offsets[k - 1][1] > start or offsets[k][1] <= start:
            return False  # not a clean char boundary (byte pieces of one char share offsets)
        if ids[k] in self.added_ids or ids[k - 1] in self.added_ids:
            return True  # a segment boundary
        if self.is_regex:
            return self._is_stable_chunk_start(prefix, ids, words, k, start)
        before = prefix[start - 1]
        return prefix[start] in (" ", SPACE_PIECE) and before not in (" ", SPACE_PIECE) and self._never_merged(before, " ")

    def is_junction(self, text: str, p: int) -> bool:
        """Can `text` be cut before char p (0 < p < len) whatever is put before it? (The
        rules: docs/tokenization.md.)"""
        before, at = text[p - 1], text[p]
        if self.is_regex:
            is_free = before in "\r\n" and at.isascii() and not at.isspace()
        else:
            is_free = self._never_merged(before, at)
        return is_free and not any(text[p : p + size] in self.added_pieces for size in range(1, self.max_added_chars + 1))

    def _never_merged(self, before: str, at: str) -> bool:
        """BPE over whole segments (Gemma): no vocab token holds the two chars side by side (" "
        read as "▁") and both are single-char tokens (no byte fallback), so no merge joins them."""
        before, at = (SPACE_PIECE if ch == " " else ch for ch in (before, at))
        model = self.backend.model
        return (before + at not in vocab_pairs(self.backend) and model.token_to_id(before) is not None
                and model.token_to_id(at) is not None)

    def _is_stable_chunk_start(self, prefix: str, ids: list[int], words: list, k: int, start: int) -> bool:
        if words[k] == words[k - 1] or (self.is_nfc and not prefix[start].isascii()):
            return False
        is_segment_closed = any(i in self.added_ids for i in ids[k:])
        return is_segment_closed or any(ch.isalnum() for ch in prefix[start + 1 :])


@dataclass(frozen=True, slots=True)
class Cut:
    head_ids: list[int]  # the whole-string tokens before `start`, special tokens included
    start: int  # char where the re-tokenized tail begins


@dataclass(frozen=True, slots=True)
class SuffixCut:
    junction: str  # suffix[:p]: tokenized after each prefix tail, followed by `sentinel`
    sentinel: str  # suffix[p]: the char after the cut, so the junction's last chunk ends as in the whole string
    tail_ids: list[int]  # tokenizer(suffix[p:]), no special tokens


@dataclass(frozen=True, slots=True)
class Tokenize:
    tokenizer: object  # a HF fast tokenizer, not changed afterwards (its rules are read once)
    add_special_tokens: bool  # True only without a chat template (the template renders BOS itself)
    cut_suffixes: bool = True  # False: every suffix is tokenized with each prefix tail (benchmarks)
    rules: CutRules | None = field(init=False, repr=False, compare=False)  # None: never cut
    _suffix_cuts: dict = field(init=False, repr=False, compare=False)  # suffix -> SuffixCut | None
    _num_suffix_cut_tokens: list = field(init=False, repr=False, compare=False)  # [tail ids kept in _suffix_cuts]
    _inner: list = field(init=False, repr=False, compare=False)  # [the same without special tokens], made once
    _last_cut: list = field(init=False, repr=False, compare=False)  # [prefix, its cut] of the last _cut_for

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", cut_rules(self.tokenizer))
        object.__setattr__(self, "_suffix_cuts", {})
        object.__setattr__(self, "_num_suffix_cut_tokens", [0])
        object.__setattr__(self, "_inner", [])
        object.__setattr__(self, "_last_cut", [])

    def __call__(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=self.add_special_tokens)["input_ids"]

    def continuations(self, prefix: str, suffixes: list[str], budget: TokenBudget | None = None) -> list[list[int]]:
        """tokenizer(prefix + suffix) for each suffix; the prefix is tokenized once. With a
        `budget`, the suffixes are tokenized CHUNK_CHARS at a time and every call is charged
        to it (TokenBudgetExceeded at the first call past it)."""
        budget = budget if budget is not None else TokenBudget.unbounded()
        cut = self._cut_for(prefix, budget) if suffixes else None
        results: list[list[int]] = []
        for chunk in chunks(suffixes, token_budget.CHUNK_CHARS):
            ids = self._continuations(cut, prefix, chunk, budget)
            budget.held(ids)
            results += ids
        return results

    def option_continuations(self, prefix: str, prompts: list[str], options: list[list[str]],
                             budget: TokenBudget | None = None) -> list[list[list[int]]]:
        """tokenizer(prefix + prompt + option) for each prompt's options, each prompt tokenized
        once: a cut in the prefix (as `continuations`), then a second one in its tail + the
        prompt, so an option costs a short tail, not its whole question (a question listing
        255 choices is read once, not 255 times)."""
        budget = budget if budget is not None else TokenBudget.unbounded()
        cut = self._cut_for(prefix, budget) if prompts else None  # no prompts: the prefix is not tokenized
        if cut is None:
            return [self.continuations(prefix, [p + o for o in opts], budget) for p, opts in zip(prompts, options)]
        inner, tail = self._without_lead(), prefix[cut.start :]
        results = []
        for prompt, opts in zip(prompts, options):
            ids = [cut.head_ids + rest for rest in inner.continuations(tail + prompt, opts, budget)]
            budget.hold(len(cut.head_ids) * len(ids))
            results.append(ids)
        return results

    def _cut_for(self, prefix: str, budget: TokenBudget) -> Cut | None:
        """The prefix's cut (`find_cut`, else all tail where cuts are allowed). The last one is
        kept: a compile asks it for the same content from `continuations` and `option_continuations`."""
        last = self._last_cut
        if last and last[0] == prefix:
            return last[1]
        cut = self.find_cut(prefix, budget)
        if cut is None and self.cut_suffixes and self.rules is not None:
            cut = Cut(self._lead(), 0)  # a short prefix: all tail
        last[:] = [prefix, cut]
        return cut

    def _without_lead(self) -> Tokenize:
        """This tokenizer adding no special tokens (self, or one made once): for text inside a sequence."""
        if not self.add_special_tokens:
            return self
        if not self._inner:
            self._inner.append(Tokenize(self.tokenizer, add_special_tokens=False, cut_suffixes=self.cut_suffixes))
        return self._inner[0]

    def _continuations(self, cut: Cut | None, prefix: str, suffixes: list[str], budget: TokenBudget) -> list[list[int]]:
        if cut is None:
            ids = self([prefix + suffix for suffix in suffixes])
            budget.tokenized(ids)
            return ids
        tail = prefix[cut.start :]
        splits = [self.suffix_cut(suffix, budget) for suffix in suffixes] if self.cut_suffixes else [None] * len(suffixes)
        junctions = list(dict.fromkeys((split.junction, split.sentinel) for split in splits if split is not None))
        whole = [index for index, split in enumerate(splits) if split is None]
        encoding = self.tokenizer([tail + j + sentinel for j, sentinel in junctions] + [tail + suffixes[i] for i in whole],
                                  add_special_tokens=False, return_offsets_mapping=bool(junctions))
        ids = encoding["input_ids"]
        budget.tokenized(ids)
        heads = {key: _before(ids[n], encoding["offset_mapping"][n], len(tail) + len(key[0]))
                 for n, key in enumerate(junctions)}
        if any(head is None for head in heads.values()):  # a token across p: the rules should make this impossible
            return self._without_suffix_cuts(cut, tail, suffixes, budget)
        results = [None if split is None else cut.head_ids + heads[split.junction, split.sentinel] + split.tail_ids
                   for split in splits]
        for index, tail_ids in zip(whole, ids[len(junctions) :]):
            results[index] = cut.head_ids + tail_ids
        return results

    def _without_suffix_cuts(self, cut: Cut, tail: str, suffixes: list[str], budget: TokenBudget) -> list[list[int]]:
        tails = self.tokenizer([tail + suffix for suffix in suffixes], add_special_tokens=False)["input_ids"]
        budget.tokenized(tails)
        return [cut.head_ids + ids for ids in tails]

    def suffix_cut(self, suffix: str, budget: TokenBudget | None = None) -> SuffixCut | None:
        """Where `suffix` splits into a junction (tokenized with each prefix) and a tail
        (tokenized once, kept); None: it is tokenized whole with each prefix tail."""
        cache, num_tokens = self._suffix_cuts, self._num_suffix_cut_tokens
        if suffix not in cache:
            found = cache[suffix] = self._find_suffix_cut(suffix, budget if budget is not None else TokenBudget.unbounded())
            num_tokens[0] += len(found.tail_ids) if found is not None else 0
            while len(cache) > MAX_NUM_SUFFIX_CUTS or (num_tokens[0] > MAX_SUFFIX_CUT_TOKENS and len(cache) > 1):
                dropped = cache.pop(next(iter(cache)))
                num_tokens[0] -= len(dropped.tail_ids) if dropped is not None else 0
            return found
        return cache[suffix]

    def _find_suffix_cut(self, suffix: str, budget: TokenBudget) -> SuffixCut | None:
        rules = self.rules
        p = next((p for p in range(1, len(suffix)) if rules.is_junction(suffix, p)), None) if rules else None
        if p is None:
            return None
        whole, tail = self.tokenizer([suffix, suffix[p:]], add_special_tokens=False)["input_ids"]
        junction = self.tokenizer(suffix[: p + 1], add_special_tokens=False, return_offsets_mapping=True)
        budget.tokenized([whole, tail, junction["input_ids"]])
        head = _before(junction["input_ids"], junction["offset_mapping"], p)
        if head is None or head + tail != whole:
            return None  # the rules should make this impossible; the suffix stays whole
        return SuffixCut(suffix[:p], suffix[p], tail)

    def find_cut(self, prefix: str, budget: TokenBudget | None = None) -> Cut | None:
        """The last safe cut at least `min_tail_chars` before the end, checked; None: none found."""
        rules = self.rules
        if rules is None or len(prefix) < MIN_PREFIX_CHARS:
            return None
        encoding = self.tokenizer(prefix, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets, words = encoding["input_ids"], encoding["offset_mapping"], encoding.word_ids()
        if budget is not None:  # None: a caller outside a compile (a cut looked at alone)
            budget.tokenized([ids])
        last = len(ids) - 1
        while last > 0 and offsets[last][0] > len(prefix) - rules.min_tail_chars:
            last -= 1
        for k in range(last, max(last - MAX_NUM_CANDIDATES, 0), -1):
            if rules.is_safe(prefix, ids, offsets, words, k):
                return self._checked_cut(prefix, ids, k, offsets[k][0])
        return None

    def _checked_cut(self, prefix: str, ids: list[int], k: int, start: int) -> Cut | None:
        [tail_ids] = self.tokenizer([prefix[start:]], add_special_tokens=False)["input_ids"]
        if tail_ids != ids[k:]:
            return None  # the rules should make this impossible; whole strings stay exact
        return Cut(self._lead() + ids[:k], start)

    def _lead(self) -> list[int]:
        return list(self.rules.lead_ids) if self.add_special_tokens else []


def _before(ids: list[int], offsets: list, boundary: int) -> list[int] | None:
    """The tokens that start before char `boundary`, or None if one of them ends past it."""
    num = 0
    while num < len(ids) and offsets[num][0] < boundary:
        num += 1
    if num and offsets[num - 1][1] > boundary:
        return None
    return ids[:num]


def cut_rules(tokenizer) -> CutRules | None:
    """The cut rules of a tokenizer whose pipeline is one we can reason about, else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "split_special_tokens", False):
        return None
    model = backend.model
    if type(model).__name__ != "BPE" or model.dropout not in (None, 0.0):
        return None
    lead_ids = _lead_ids(tokenizer, _component(backend.post_processor))
    added = backend.get_added_tokens_decoder()
    if lead_ids is None or any(t.lstrip or t.rstrip or t.single_word for t in added.values()):
        return None
    normalizer, pre = _component(backend.normalizer), _component(backend.pre_tokenizer)
    is_nfc = normalizer == {"type": "NFC"}
    if is_nfc and any(t.normalized for t in added.values()):
        return None  # NFC changes lengths: the added-token margin would not hold in chars
    max_added_chars = max((len(t.content) for t in added.values()), default=0)
    common = {
        "lead_ids": lead_ids,
        "added_ids": frozenset(added),
        "min_tail_chars": max(MIN_TAIL_CHARS, max_added_chars + 1),
        "max_added_chars": max_added_chars,
        "added_pieces": frozenset(t.content[i:] for t in added.values() for i in range(len(t.content))),
        "is_nfc": is_nfc,
        "backend": backend,
    }
    if (normalizer is None or is_nfc) and _is_known_regex(pre):
        return CutRules(is_regex=True, **common)
    if _is_space_to_piece(normalizer, pre) and _is_plain_bpe(model) and model.token_to_id(SPACE_PIECE) is not None:
        return CutRules(is_regex=False, **common)
    return None


def _component(part) -> dict | None:
    return None if part is None else json.loads(part.__getstate__())


def _lead_ids(tokenizer, post: dict | None) -> tuple[int, ...] | None:
    """Special tokens the post-processor puts before a single text; None if it appends any."""
    if post is None or post == {**post, "type": "ByteLevel", "trim_offsets": False}:  # Qwen3: offsets kept
        lead: tuple[int, ...] = ()
    elif post.get("type") == "TemplateProcessing":
        *specials, last = post["single"]
        if last != {"Sequence": {"id": "A", "type_id": 0}} or any("SpecialToken" not in p for p in specials):
            return None
        lead = tuple(i for p in specials for i in post["special_tokens"][p["SpecialToken"]["id"]]["ids"])
    else:
        return None
    for probe in ("Hello", " a b\n"):  # the contract, checked once
        plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
        if tokenizer(probe, add_special_tokens=True)["input_ids"] != list(lead) + plain:
            return None
    return lead


def _is_known_regex(pre: dict | None) -> bool:
    if pre is None:
        return False
    if pre.get("type") == "ByteLevel":  # GPT-2's regex built in (SmolLM2)
        return pre.get("use_regex") is True and pre.get("add_prefix_space") is False
    if pre.get("type") != "Sequence" or len(pre.get("pretokenizers", [])) != 2:
        return False
    split, byte_level = pre["pretokenizers"]
    return (
        split.get("type") == "Split"
        and split.get("pattern", {}).get("Regex") in KNOWN_SPLIT_REGEXES
        and split.get("behavior") == "Isolated"
        and split.get("invert") is False
        and byte_level.get("type") == "ByteLevel"
        and byte_level.get("add_prefix_space") is False
        and byte_level.get("use_regex") is False
    )


def _is_space_to_piece(normalizer: dict | None, pre: dict | None) -> bool:
    """Gemma's pipeline: " " -> "▁", then a split on " " that never finds one (or none)."""
    if normalizer != {"type": "Replace", "pattern": {"String": " "}, "content": SPACE_PIECE}:
        return False
    return pre is None or (
        pre.get("type") == "Split" and pre.get("pattern") == {"String": " "} and pre.get("invert") is False
    )


def _is_plain_bpe(model) -> bool:
    return not model.continuing_subword_prefix and not model.end_of_word_suffix and not model.ignore_merges


_VOCAB_PAIRS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # backend -> adjacent char pairs


def vocab_pairs(backend) -> frozenset[str]:
    """Every two adjacent chars inside some vocab token: where a BPE merge may join two chars.
    Read once per tokenizer (one pass over the whole vocab), on the first cut."""
    if backend not in _VOCAB_PAIRS:
        vocab = backend.get_vocab(with_added_tokens=False)
        _VOCAB_PAIRS[backend] = frozenset(token[i : i + 2] for token in vocab for i in range(len(token) - 1))
    return _VOCAB_PAIRS[backend]
