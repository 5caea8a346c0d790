"""Render a request's messages into the text that every question continues.

    messages + answer_in (+ is_floor) --render_prefix--> prefix text

With a chat template the final message is left open ("user": the question continues the
user's text) or the user turn is closed and an assistant turn opened ("assistant").
Contents are swapped for unique sentinels before the template runs and put back after, so
the template never sees (and never trims or closes) a content, and an emptied content for
the floor leaves the turn open exactly like a real one. A message's `floor_content` (set
by a pack presentation) is what its floor renders: the frame stays, the content goes. Without a chat template the
contents are joined by blank lines.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from contract.protocol import Message


class PromptError(ValueError):
    """A request this model cannot render; `field` names the part to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class PromptRenderer:
    tokenizer: object  # a HF tokenizer; only its chat template is used here
    has_chat_template: bool

    def render_prefix(self, messages: list[Message], answer_in: str, is_floor: bool = False) -> str:
        contents = [_content(m, is_floor) for m in messages]
        if not self.has_chat_template:
            if answer_in == "assistant":
                raise PromptError(
                    "scoring.queries.answer_in",
                    "this model has no chat template, so answer_in 'assistant' cannot be rendered; use 'user'",
                )
            return "\n\n".join(contents)
        return self._render_chat(messages, contents, answer_in)

    def _render_chat(self, messages: list[Message], contents: list[str], answer_in: str) -> str:
        sentinels = [f"\x00SPINF{uuid.uuid4().hex}{i}\x00" for i in range(len(messages))]
        chat = [{"role": m.role, "content": s} for m, s in zip(messages, sentinels, strict=True)]
        is_open_assistant = answer_in == "assistant"
        if is_open_assistant and messages[-1].role == "assistant":
            raise PromptError(
                "scoring.queries.answer_in",
                "answer_in 'assistant' needs the last message to be a user or system message",
            )
        text = self.tokenizer.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=is_open_assistant
        )
        if not is_open_assistant:
            end = text.rfind(sentinels[-1])
            if end < 0:
                raise PromptError("messages", "the chat template dropped the final message; it cannot be continued")
            text = text[: end + len(sentinels[-1])]
        for sentinel, content in zip(sentinels, contents, strict=True):
            text = text.replace(sentinel, content)
        return text


def _content(message: Message, is_floor: bool) -> str:
    """The text put back in place of the message's sentinel. A floor renders the message's
    `floor_content` (a pack's frame without its content), else empties user messages."""
    if not is_floor:
        return message.content
    if message.floor_content is not None:
        return message.floor_content
    return "" if message.role == "user" else message.content
