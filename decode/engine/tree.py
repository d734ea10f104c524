"""The fused pass's tree (``prove.decode.engine.fused``): where each new entry sits and what it may attend.

A pure function of the proposal's length, the groups and the second candidate, kept apart from the proposer and
verifier that plan and run it because three readers share it: the fused verifier's pass, the device cycle's
constant tree (``prove.decode.engine.cycles``) and the pass-cost calibration's causal chains
(``prove.decode.engine.pass_cost``). The layout's meaning (G_j = the block pass from y_j) is argued in ``fused``'s
docstring; ``tests/decode/engine/test_fused.py`` checks it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class TreeLayout:
    """The new entries after the pending tokens: y_1..y_k, then the branch (if any), then the groups in
    increasing j."""

    k: int
    offsets: torch.Tensor
    """(E,) long: each entry's position minus L (the length of the committed sequence; y_1 is at 0)."""
    attend: torch.Tensor
    """(E, E) bool: entry (row) may attend entry (column). Every entry also sees context and pending."""
    groups: tuple[tuple[int, int, int], ...]
    """(j, index of G_j's first entry among the E, m_j) per group."""
    branch: int | None = None
    """b: the k − b entries right after the y's are the branch [z, y_{b+2}..y_k] (positions of y_{b+1}..y_k,
    seeing y_1..y_b and each other causally); None: no branch."""
    branch_group: tuple[int, int] | None = None
    """(index of its first entry, m): the group after the whole branch (the next proposal if the branch is
    accepted to its end), right after the branch's entries; None: none."""

    @property
    def width(self) -> int:
        return int(self.offsets.shape[0])


def tree_layout(
    k: int, groups: Sequence[tuple[int, int]], branch: int | None = None, branch_group: int = 0
) -> TreeLayout:
    """The fused tree for a proposal of ``k`` tokens and ``groups`` = [(j, m_j)] (0 ≤ j ≤ k, m_j ≥ 1,
    each j once): y_i at offset i−1, causal among the y's; G_j's entry r at offset j+r, seeing y_1..y_j and
    G_j's entries 0..r. ``branch`` = b (0 ≤ b < k): k − b more entries after the y's, at offsets b..k−1,
    seeing y_1..y_b and each other causally (the block with a second candidate at position b), then
    ``branch_group`` placeholders at offsets k.. that see y_1..y_b, the whole branch and each other causally
    (the group G_k of the branch). A pure function of its arguments, built once per distinct tree (a decode
    reuses a handful: its tensors are shared, never written)."""
    groups_key = tuple(sorted((int(j), int(m)) for j, m in groups))
    return _tree_layout(k, groups_key, branch, branch_group if branch is not None else 0)


@functools.lru_cache(maxsize=1024)
def _tree_layout(
    k: int, groups: tuple[tuple[int, int], ...], branch: int | None, branch_group: int
) -> TreeLayout:
    if k < 0:
        raise ValueError(f"k={k} must be ≥ 0")
    if branch is not None and not 0 <= branch < k:
        raise ValueError(f"branch={branch} needs 0 ≤ b < k={k}")
    if branch_group < 0:
        raise ValueError(f"branch_group={branch_group} must be ≥ 0")
    js = [j for j, _ in groups]
    if len(set(js)) != len(js):
        raise ValueError(f"groups {list(groups)} repeat an acceptance length")
    for j, m in groups:
        if not 0 <= j <= k or m < 1:
            raise ValueError(f"group (j={j}, m={m}) needs 0 ≤ j ≤ k={k} and m ≥ 1")
    sizes = [m for _, m in sorted(groups)]
    nb = 0 if branch is None else k - branch
    width = k + nb + branch_group + sum(sizes)
    # numpy while building (a layout is dozens of slice writes; torch's per-op cost made a miss ~0.4 ms)
    offsets = np.empty(width, dtype=np.int64)
    attend = np.zeros((width, width), dtype=bool)
    offsets[:k] = np.arange(k)
    attend[:k, :k] = np.tri(k, dtype=bool)
    if branch is not None:
        rows = slice(k, k + nb)
        offsets[rows] = np.arange(branch, k)
        attend[rows, :branch] = True  # y_1..y_b
        attend[rows, rows] = np.tri(nb, dtype=bool)
    bg = None
    if branch_group:
        assert branch is not None
        rows = slice(k + nb, k + nb + branch_group)
        offsets[rows] = np.arange(k, k + branch_group)
        attend[rows, :branch] = True  # y_1..y_b
        attend[rows, k : k + nb] = True  # the whole branch
        attend[rows, rows] = np.tri(branch_group, dtype=bool)
        bg = (k + nb, branch_group)
    placed = []
    start = k + nb + branch_group
    for j, m in sorted(groups):
        rows = slice(start, start + m)
        offsets[rows] = np.arange(j, j + m)
        attend[rows, :j] = True  # y_1..y_j
        attend[rows, rows] = np.tri(m, dtype=bool)  # causal inside the group
        placed.append((j, start, m))
        start += m
    return TreeLayout(
        k=k,
        offsets=torch.from_numpy(offsets),
        attend=torch.from_numpy(attend),
        groups=tuple(placed),
        branch=branch,
        branch_group=bg,
    )
