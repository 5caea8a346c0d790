"""A bounded cache of floors: p for a question with the user's content emptied.

    FloorKey(empty prefix, answer_in, filled template, options) -> floor p per option

A floor depends only on its key and the engine's fingerprint (the cache lives inside one
engine), never on a content, so it is computed once and served to every content after.
"""

from __future__ import annotations

from collections import OrderedDict

from engine.pipeline.stages import FloorKey

DEFAULT_FLOOR_CACHE_SIZE = 4096


class FloorCache:
    def __init__(self, max_num_entries: int = DEFAULT_FLOOR_CACHE_SIZE) -> None:
        self.max_num_entries = max_num_entries
        self._entries: OrderedDict[FloorKey, tuple[float, ...]] = OrderedDict()

    def get(self, key: FloorKey) -> tuple[float, ...] | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: FloorKey, floor_p: tuple[float, ...]) -> None:
        self._entries[key] = floor_p
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_num_entries:
            self._entries.popitem(last=False)

    def __contains__(self, key: FloorKey) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
