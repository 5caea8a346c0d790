"""Whole-string tokenization of many continuations of one prefix, exact and fast.

    (prefix, [suffix, ...]) --Tokenize.continuations--> [tokenizer(prefix + suffix), ...]

    prefix --tokenize once (offsets, word ids)--> cut: token k at char c, safe and checked
    [prefix[c:] + suffix, ...] --one batched call, no special tokens--> tails
    result = (lead special tokens) + prefix_ids[:k] + tail          (else: whole strings)

The engine scores exactly `tokenizer(prefix + suffix)`: tokenizers merge across the
boundary, so separately tokenized parts are not enough. But an appended suffix can only
change tokens near the end of the prefix, so the long prefix (a ~500-token article) is
tokenized once and only a short tail of it is tokenized again with each suffix.

Why the result is exact. A HF fast tokenizer (1) splits the text at added tokens (matched
leftmost-longest on the raw text), (2) normalises each remaining segment, (3) cuts it into
chunks (the pre-tokenizer), (4) runs BPE on each chunk alone, (5) puts special tokens
around (post-processor). A cut at char c is used only when the chunks before c are the
same in `prefix` and in `prefix + suffix` for EVERY suffix and c starts a chunk in both:
  - added tokens: c is at least `min_tail_chars` (longer than any added token) before the
    end, so no match that starts before c can reach the suffix (leftmost-longest keeps
    every earlier decision); a cut next to an added token is a segment boundary;
  - regex pre-tokenizers (Qwen2/2.5/3's Split regex + ByteLevel, Llama-3's, GPT-2's
    ByteLevel regex used by SmolLM2): the regexes have no lookbehind, and the match at a
    position looks at most one char past its end, except whitespace alternatives, which
    look to the end of the whitespace run plus one. So if c is a chunk boundary (word ids
    change), at least one letter or digit follows c+1 inside the same segment (or an added
    token closes the segment before the end), every match ending at or before c saw only
    prefix chars: it is the same with any suffix, and matching restarts at c exactly as it
    does on `prefix[c:] + suffix`. NFC (Qwen's normaliser in transformers 5) composes a
    char only with what follows it, never across an ASCII char: mid-segment cuts are made
    only before ASCII, so a suffix that starts with a combining mark is no problem (it is
    in the tail, with the chars it composes with);
  - Gemma-3 (" " -> "▁", then BPE over each whole segment, no pre-tokenizer): a BPE merge
    only ever makes a vocab token, so a boundary between chars x and "▁" can never be
    merged over when no vocab token contains x + "▁" (in Gemma's 262k vocab only ">" ever
    precedes an inner "▁"); both sides then merge independently. The cut is before a "▁"
    that follows such an x (a single-char token, so no byte fallback is involved).
Any other tokenizer (another normaliser or pre-tokenizer, BPE dropout, a post-processor
that appends tokens, added tokens that strip spaces) always gets whole-string tokenization.
Every cut is also checked at run time: `tokenizer(prefix[c:])` must give `prefix_ids[k:]`,
else whole strings. Special tokens (Gemma's BOS without a chat template) go on the head only.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass, field

MIN_PREFIX_CHARS = 256  # shorter prefixes are tokenized whole: a cut would save little
MIN_TAIL_CHARS = 16  # the prefix tail tokenized again with every suffix is at least this long
MAX_NUM_CANDIDATES = 64  # tokens tried, back from the end, before giving up on a cut
SPACE_PIECE = "\u2581"  # SentencePiece's "▁": Gemma's normaliser writes it for " "
# The pre-tokenizer regexes whose chunk boundaries are known to be stable (see above).
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_REGEX = QWEN2_REGEX.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
KNOWN_SPLIT_REGEXES = frozenset({QWEN2_REGEX, LLAMA3_REGEX})


@dataclass(frozen=True, slots=True)
class CutRules:
    """Where this tokenizer can be cut (the module docstring says why each rule is exact)."""

    is_regex: bool  # chunks from a known regex; else BPE over whole segments (Gemma-3)
    is_nfc: bool  # NFC normaliser: a mid-segment cut only before an ASCII char
    lead_ids: tuple[int, ...]  # what add_special_tokens puts before the text (Gemma's BOS)
    added_ids: frozenset[int]  # added tokens split the text before normalisation
    min_tail_chars: int  # longer than any added token: none can straddle the cut
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
        return (
            prefix[start] in (" ", SPACE_PIECE)
            and before not in (" ", SPACE_PIECE)
            and self.backend.model.token_to_id(before) is not None  # no byte fallback
            and before not in chars_before_piece(self.backend)
        )

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
class Tokenize:
    tokenizer: object  # a HF fast tokenizer, not changed afterwards (its rules are read once)
    add_special_tokens: bool  # True only without a chat template (the template renders BOS itself)
    rules: CutRules | None = field(init=False, repr=False, compare=False)  # None: never cut

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", cut_rules(self.tokenizer))

    def __call__(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=self.add_special_tokens)["input_ids"]

    def continuations(self, prefix: str, suffixes: list[str]) -> list[list[int]]:
        """tokenizer(prefix + suffix) for each suffix; the prefix is tokenized once."""
        cut = self.find_cut(prefix) if suffixes else None
        if cut is None:
            return self([prefix + suffix for suffix in suffixes])
        tail = prefix[cut.start :]
        tails = self.tokenizer([tail + suffix for suffix in suffixes], add_special_tokens=False)["input_ids"]
        return [cut.head_ids + ids for ids in tails]

    def find_cut(self, prefix: str) -> Cut | None:
        """The last safe cut at least `min_tail_chars` before the end, checked; None: none found."""
        rules = self.rules
        if rules is None or len(prefix) < MIN_PREFIX_CHARS:
            return None
        encoding = self.tokenizer(prefix, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets, words = encoding["input_ids"], encoding["offset_mapping"], encoding.word_ids()
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
        lead = list(self.rules.lead_ids) if self.add_special_tokens else []
        return Cut(lead + ids[:k], start)


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


_CHARS_BEFORE_PIECE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # backend -> chars


def chars_before_piece(backend) -> frozenset[str]:
    """Chars x such that some vocab token holds x + "▁" (x not "▁"): a merge may cross there.
    Reading a 262k vocab takes ~1 s, so it is done once per tokenizer, on the first cut."""
    if backend not in _CHARS_BEFORE_PIECE:
        _CHARS_BEFORE_PIECE[backend] = _scan_chars_before_piece(backend.get_vocab(with_added_tokens=False))
    return _CHARS_BEFORE_PIECE[backend]


def _scan_chars_before_piece(vocab: dict[str, int]) -> frozenset[str]:
    found = set()
    for token in vocab:
        inner = token.lstrip(SPACE_PIECE)
        position = inner.find(SPACE_PIECE)
        while position > 0:
            if inner[position - 1] != SPACE_PIECE:
                found.add(inner[position - 1])
            position = inner.find(SPACE_PIECE, position + 1)
    return frozenset(found)
