"""What compiling one request may cost, counted while it is tokenized.

    compile_request(..., TokenBudget(max_tokenized, max_held))
      Tokenize.continuations / option_continuations: suffixes in calls of about CHUNK_CHARS
      characters; every tokenizer call -> budget.tokenized(ids), every returned sequence ->
      budget.held(ids); past either limit TokenBudgetExceeded (compile_request makes it a
      PromptError on `scoring.queries`: an error row, a 422 on a sync call)

The limits are contract.settings.RequestLimits.max_tokenized_tokens / max_held_tokens; what
the largest admitted requests cost is measured by benchmarks/request_memory.py.
"""

from __future__ import annotations

from dataclasses import dataclass

CHUNK_CHARS = 1 << 18  # suffixes are tokenized in calls of about this many characters


class TokenBudgetExceeded(ValueError):
    """A request whose compiling would hold or tokenize more tokens than its TokenBudget allows."""


@dataclass(slots=True)
class TokenBudget:
    """What compiling one request may cost, counted while it is tokenized (calls of about
    CHUNK_CHARS characters, so a request over it stops at the call that crosses it):
    `max_tokenized`: tokens the tokenizer returns (each is a new object, ~36 bytes held, and
    ~100 bytes more inside the tokenizer during its call); `max_held`: tokens of every sequence
    returned, content included (the content's ids are shared, 8 bytes each)."""

    max_tokenized: int
    max_held: int
    num_tokenized: int = 0
    num_held: int = 0

    @classmethod
    def unbounded(cls) -> TokenBudget:
        """A budget that only counts (a compile without limits: floors, benchmarks)."""
        return cls(max_tokenized=1 << 62, max_held=1 << 62)

    def tokenized(self, ids: list[list[int]]) -> None:
        self.num_tokenized += sum(map(len, ids))
        if self.num_tokenized > self.max_tokenized:
            raise TokenBudgetExceeded(
                f"compiling the request tokenizes more than {self.max_tokenized} tokens (the limit"
                " max_tokenized_tokens; an option of a short question is tokenized with its whole question):"
                " ask fewer or shorter questions")

    def held(self, ids: list[list[int]]) -> None:
        self.hold(sum(map(len, ids)))

    def hold(self, num_tokens: int) -> None:
        self.num_held += num_tokens
        if self.num_held > self.max_held:
            raise TokenBudgetExceeded(
                f"the request's sequences (content + question + option, each) are more than {self.max_held}"
                " tokens together (the limit max_held_tokens): shorten the content or ask fewer questions")


def chunks(suffixes: list[str], num_chars: int) -> list[list[str]]:
    """`suffixes` in order, in runs of about `num_chars` characters (at least one suffix each)."""
    chunks: list[list[str]] = [[]]
    size = 0
    for suffix in suffixes:
        if chunks[-1] and size + len(suffix) > num_chars:
            chunks.append([])
            size = 0
        chunks[-1].append(suffix)
        size += len(suffix)
    return chunks
