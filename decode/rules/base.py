"""What every acceptance rule returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Accept:
    """The verdict of a rule on one proposed block y_1..y_k.

    ``n`` leading proposed tokens are committed (0 ≤ n ≤ k), then ``extra`` if it is not ``None``:
    the correction token (n < k) or the bonus token (n = k) that rules with a target distribution add.
    Mean accepted length as reported counts ``extra`` too.
    """

    n: int
    extra: int | None = None
    path: tuple[int, ...] | None = None
    """The n committed proposal tokens when they are not y_1..y_n (a proposal's branch was accepted:
    ``rules.block.greedy_match_branch``); None otherwise."""

    @property
    def committed(self) -> int:
        return self.n + (self.extra is not None)
