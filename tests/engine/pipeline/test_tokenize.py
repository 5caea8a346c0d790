"""Tokenize.continuations: equal to whole-string tokenization, and actually taking the fast path.

Real tokenizers of the registry (Qwen2.5's regex + NFC, SmolLM2's GPT-2 regex, Gemma-3's
BPE over whole segments), fuzzed with seeded prefixes and suffixes built from the pieces
that make tokenizers merge across a boundary.
"""

import copy
import functools
import random

import pytest
from tokenizers import Regex, pre_tokenizers
from transformers import AutoTokenizer

from engine.loading.loader import registry_tokenizer_dir
from engine.pipeline.tokenize import MIN_PREFIX_CHARS, Tokenize

TOKENIZERS = ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m")
NUM_FUZZ_PREFIXES = 400
NUM_SUFFIXES = 8

WORDS = (
    "the", "article", "said", "government", "on", "Monday", "market", "rose", "it's", "they'll",
    "don't", "UK", "£5bn", "per", "cent", "co-operation", "e-mail", "naïve", "café", "Zürich",
)
NASTY = (
    " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\r\n", " \n", "\n ", "  \n  ", " " * 33, "\n" * 35,
    "\u00a0", "\u3000", "\u2028", "\x0b", "\x0c", "\x1c", "\u2581", "\u2581\u2581",
    "中文字符", "日本語のテキスト", "한국어", "\u1100\u1161", "\u11a8", "😀", "👍🏽", "🇫🇷", "👨\u200d👩\u200d👧",
    "e\u0301", "\u0301", "\u0308", "a\u0323\u0302", "\u0327", "Å", "ﬁ",
    "0", "7", "123", "2024", "3.14", "1,000,000", "１２３",
    "!!!", "...", "?!", "---", "***", "=" * 30, ")", ");", ";", "}", "};", ":", "{", "(", "[", "]",
    "'", '"', "'s", "'S", "'ll", "'re", "`", "«", "»", "“", "”", "—", "<", ">", ">\u2581</", "> </",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_", "start|>", "<start_of_turn>", "<end_of_turn>",
    "<start_of", "_turn>", "<bos>", "<b>", "</b>", "<table>", "[multimodal]", "user\n", "assistant\n",
)
SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<start_of_turn>", "<end_of_turn>", "<b>", "<table>",
            "\n" * 12, "[multimodal]")
RUN_ALPHABETS = (  # runs of one kind of char, up to 45 long: what regexes, NFC and BPE reach over
    " ", "\n", " \n", " \t\n\r", "\u00a0\u3000 \x0b", "\u2581 ", "!?.;:)}=-*", "0123456789",
    "abcdefghijklmnopqrstuvwxyz", "中文字符日本語", "\u0323", "\u0323\u0301\u0302\u0308\u0327", "😀👍🏽",
)
QUESTION = "\n\nQuestion: Is the article about business or the economy?\nAnswer yes or no:"


@pytest.fixture(scope="module", params=TOKENIZERS)
def tokenizer(request):
    return _load(request.param)


@functools.cache
def _load(name: str):
    return AutoTokenizer.from_pretrained(registry_tokenizer_dir(name))


def _run(rng: random.Random) -> str:
    alphabet = rng.choice(RUN_ALPHABETS)
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 45)))


def _pieces(rng: random.Random, count: int, nasty_share: float) -> str:
    return "".join(
        rng.choice(NASTY) if rng.random() < nasty_share else rng.choice((" ", " ", "", "\n")) + rng.choice(WORDS)
        for _ in range(count)
    )


def _ending(rng: random.Random) -> str:
    return "".join(_run(rng) if rng.random() < 0.5 else rng.choice(NASTY) for _ in range(rng.randint(0, 5)))


def _case(rng: random.Random) -> tuple[str, list[str]]:
    """A prefix whose end is nasty, and suffixes that start by continuing it."""
    prefix = _pieces(rng, rng.randint(40, 140), 0.3) + _ending(rng)
    split_special = ""
    if rng.random() < 0.2:  # a special token cut in two by the boundary
        special = rng.choice(SPECIALS)
        cut = rng.randint(1, len(special) - 1)
        prefix, split_special = prefix + special[:cut], special[cut:]
    return prefix, [_suffix(rng, split_special) for _ in range(NUM_SUFFIXES)]


def _suffix(rng: random.Random, split_special: str) -> str:
    kind = rng.random()
    if kind < 0.1:
        return ""
    if kind < 0.2:
        return QUESTION + rng.choice((" yes", " no", ""))
    start = split_special if rng.random() < 0.5 else ""
    return start + (_run(rng) if kind < 0.6 else "") + _pieces(rng, rng.randint(0, 4), 0.7)


def _whole(tokenizer, prefix: str, suffixes: list[str], add_special_tokens: bool) -> list[list[int]]:
    return tokenizer([prefix + s for s in suffixes], add_special_tokens=add_special_tokens)["input_ids"]


def test_fuzzed_continuations_equal_whole_string_tokens(tokenizer):
    rng = random.Random(20261201)
    by_special = {flag: Tokenize(tokenizer, add_special_tokens=flag) for flag in (False, True)}
    num_cut = 0
    for _ in range(NUM_FUZZ_PREFIXES):
        (prefix, suffixes), flag = _case(rng), rng.random() < 0.5
        tokenize = by_special[flag]
        num_cut += tokenize.find_cut(prefix) is not None
        expected = _whole(tokenizer, prefix, suffixes, flag)
        assert tokenize.continuations(prefix, suffixes) == expected, (prefix, suffixes, flag)
    # the fuzz must exercise the fast path, not only the fallback
    assert num_cut >= NUM_FUZZ_PREFIXES // 2, num_cut


def test_every_cut_point_of_one_prefix_is_exact(tokenizer):
    """Cut the same text at every length, so the prefix ends on each kind of boundary."""
    rng = random.Random(7)
    text = _pieces(rng, 260, 0.5)
    tokenize = Tokenize(tokenizer, add_special_tokens=False)
    suffixes = ["", " ", "\n", "\u0301", "'s", "s", "<|im_end|>", "\n\n", "!", "1", "\u2581x", QUESTION]
    num_cut = 0
    for end in range(MIN_PREFIX_CHARS, len(text), 3):
        prefix = text[:end]
        num_cut += tokenize.find_cut(prefix) is not None
        assert tokenize.continuations(prefix, suffixes) == _whole(tokenizer, prefix, suffixes, False), prefix
    assert num_cut > 0


def test_a_whitespace_run_at_the_end_is_never_cut_inside(tokenizer):
    """Qwen2.5 has one token for "\\n" + 24 spaces + "\\n": a cut after the first newline
    (a chunk boundary of the prefix alone) would split it once the suffix adds a newline."""
    tokenize = Tokenize(tokenizer, add_special_tokens=False)
    body = "The market rose on Monday. " * 12
    suffixes = ["\n", " \n", "\n\n", "\r\n", "\t\n", "\nx", "x", " ", "\u0301"]
    for newline in ("\n", "\n\n", "\r\n", " \n"):
        for space in (" ", "\t", "\u00a0", "\u3000"):
            for length in range(1, 41):
                prefix = body + "x" + newline + space * length
                assert tokenize.continuations(prefix, suffixes) == _whole(tokenizer, prefix, suffixes, False), prefix


def test_a_news_prompt_is_cut_close_to_its_end(tokenizer):
    has_template = bool(tokenizer.chat_template)
    article = " ".join(["Shares in the company rose 5% on Monday, the firm said."] * 20)
    if has_template:
        chat = [{"role": "user", "content": f"Read this news article.\n\n{article}"}]
        prefix = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    else:
        prefix = f"Read this news article.\n\n{article}"
    tokenize = Tokenize(tokenizer, add_special_tokens=not has_template)
    cut = tokenize.find_cut(prefix)
    assert cut is not None
    assert len(prefix) - cut.start <= 80  # only a short tail is tokenized again
    suffixes = [QUESTION, QUESTION + " yes", QUESTION + " no"]
    assert tokenize.continuations(prefix, suffixes) == _whole(tokenizer, prefix, suffixes, not has_template)


def test_gemma_bos_is_on_the_head_only():
    tokenizer = _load("gemma-3-270m")
    tokenize = Tokenize(tokenizer, add_special_tokens=True)
    prefix = "word " * 80
    [ids] = tokenize.continuations(prefix, [" end"])
    assert tokenize.find_cut(prefix) is not None
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id


def test_an_unknown_pre_tokenizer_is_never_cut():
    tokenizer = copy.deepcopy(_load("qwen2.5-coder-0.5b-instruct"))
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"\p{L}+|[^\p{L}]"), "isolated"), pre_tokenizers.ByteLevel(False, use_regex=False)]
    )
    tokenize = Tokenize(tokenizer, add_special_tokens=False)
    prefix, suffixes = "abc " * 100, ["def", " x"]
    assert tokenize.rules is None and tokenize.find_cut(prefix) is None
    assert tokenize.continuations(prefix, suffixes) == _whole(tokenizer, prefix, suffixes, False)


CLOSINGS = ("<|im_end|>\n<|im_start|>assistant\n", "<end_of_turn>\n<start_of_turn>model\n", "\nAnswer:", "")


def test_suffix_cuts_hold_whatever_text_comes_before(tokenizer):
    """Question suffixes are cut once and their tails reused under every prefix: fuzzed prefixes
    (nasty endings, split special tokens) x question-like suffixes must equal whole strings."""
    rng = random.Random(11)
    tokenize = Tokenize(tokenizer, add_special_tokens=False)
    suffixes = [QUESTION + option for option in (" yes", " no", "")]
    suffixes += [f"\n\n{word} it?{closing} {option}" for word in ("Is", "Does", "Why", "1st", "(a)") for closing in CLOSINGS
                 for option in ("yes", "no")]
    suffixes += ["\r\nA\n", "\nQ", "x\nQuestion: ok\nAnswer:", "\u0301\nQuestion", "\n\u00e9t\u00e9?"]
    with_specials = Tokenize(tokenizer, add_special_tokens=True)
    for _ in range(150):
        prefix, _ = _case(rng)
        assert tokenize.continuations(prefix, suffixes) == _whole(tokenizer, prefix, suffixes, False), prefix
        short = prefix[len(prefix) - rng.randint(0, MIN_PREFIX_CHARS - 1) :]  # a short message: all tail
        assert tokenize.find_cut(short) is None
        for flag, tokenizes in ((False, tokenize), (True, with_specials)):
            assert tokenizes.continuations(short, suffixes) == _whole(tokenizer, short, suffixes, flag), (short, flag)
    split = tokenize.suffix_cut(QUESTION + " yes")
    assert split is not None and (split.junction, split.sentinel) == ("\n\n", "Q")  # shared by every question
    assert sum(tokenize.suffix_cut(s) is not None for s in suffixes) >= len(suffixes) // 2


def test_an_added_token_that_could_reach_over_a_suffix_cut_refuses_it():
    """An added token "x\\nQue" is matched on the raw text first: after a prefix ending in "x"
    it spans the place a suffix "\\nQuestion..." would otherwise be cut (before "Q")."""
    tokenizer = copy.deepcopy(_load("smollm2-135m-instruct"))
    tokenizer.add_tokens(["x\nQue"])
    tokenize = Tokenize(tokenizer, add_special_tokens=False)
    suffix = "\nQuestion: is it?\nAnswer:"
    split = tokenize.suffix_cut(suffix)
    assert tokenize.rules is not None and split is not None and split.junction == "\nQuestion: is it?\n"
    prefix = "The market rose on Monday. " * 12 + "x"
    assert tokenize.find_cut(prefix) is not None
    assert tokenize.continuations(prefix, [suffix]) == _whole(tokenizer, prefix, [suffix], False)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_no_suffix_cut_where_an_added_token_starts(name):
    """An added token right after the line break ends the segment there in the whole string:
    GPT-2's regex then takes " \n" as one chunk, which a plain sentinel char would split
    (SmolLM2: prefix "Hello world " + "\n<|im_end|>" gave " " "\n" instead of " \n")."""
    tokenizer = _load(name)
    closings = ["\n<|im_end|>", "\n<|im_end|>\n<|im_start|>assistant\nyes", "\n<end_of_turn>\n<start_of_turn>model\nyes"]
    prefixes = ["Hello world ", "\r", "\n", "x  ", "The market rose on Monday. " * 12 + "\n", "The market rose. " * 20 + " "]
    for flag in (False, True):
        tokenize = Tokenize(tokenizer, add_special_tokens=flag)
        for prefix in prefixes:
            assert tokenize.continuations(prefix, closings) == _whole(tokenizer, prefix, closings, flag), (prefix, flag)
