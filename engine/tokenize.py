"""Whole-string tokenization of many continuations of one prefix.

    (prefix, [suffix, ...]) --Tokenize.continuations--> [tokenizer(prefix + suffix), ...]

The engine scores exactly `tokenizer(prefix + suffix)` for every string: tokenizers merge
across the boundary, so the concatenation of separately tokenized parts is not enough.
This is the one place that tokenizes prompts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Tokenize:
    tokenizer: object  # a HF fast tokenizer
    add_special_tokens: bool  # True only without a chat template (the template renders BOS itself)

    def __call__(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=self.add_special_tokens)["input_ids"]

    def continuations(self, prefix: str, suffixes: list[str]) -> list[list[int]]:
        """tokenizer(prefix + suffix) for each suffix, in one batched call."""
        return self([prefix + suffix for suffix in suffixes])
