"""A page of a list endpoint (GET /v1/files, /v1/batches, /v1/jobs), as OpenAI's cursor pages.

    [objects with an `id`], has_more --ListPage.of--> {object: "list", data, first_id, last_id, has_more}
The next page is `?after=<last_id>`; the SDK's pagers follow it while `has_more`.
"""

from __future__ import annotations

from typing import Generic, Literal, TypeVar

from pydantic import BaseModel

Item = TypeVar("Item", bound=BaseModel)


class ListPage(BaseModel, Generic[Item]):
    object: Literal["list"] = "list"
    data: list[Item]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool

    @classmethod
    def of(cls, data: list[Item], has_more: bool):
        return cls(data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None,
                   has_more=has_more)
