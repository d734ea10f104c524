"""``IdentityMemo``: values built from tensors, kept per tensor identity (not per content) and reused.

A tensor does not hash by content, and its ``id`` may be reused once it is freed; so each entry holds the tensors
it was keyed by: while it lives no other object can have their ids, and a key hit is the very same objects.
Used where the engine would otherwise rebuild the same small tensors every cycle: a fused tree's mask
(``engine.ModelRunner``) and the penalty that keeps disallowed ids out (``sampling.restrict``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class IdentityMemo(Generic[V]):
    """``get(objects, extra, build)``: ``build()``'s value for these very ``objects`` and the hashable ``extra``,
    built on the first call and returned again after; at most ``size`` entries (it starts over when full)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: dict[tuple[Hashable, ...], tuple[tuple[Any, ...], V]] = {}

    def get(self, objects: tuple[Any, ...], extra: tuple[Hashable, ...], build: Callable[[], V]) -> V:
        key = (*map(id, objects), *extra)
        hit = self._entries.get(key)
        if hit is not None:
            return hit[1]
        if len(self._entries) >= self.size:
            self._entries.clear()
        value = build()
        self._entries[key] = (objects, value)
        return value
