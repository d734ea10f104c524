"""Published numbers the bench draws beside its own, each with where it comes from; nothing here is interpolated.

ProVe's 32B proposer (Qwen2.5-32B-Instruct, MARS-trained at K = 16 on a general chat mixture): the chance that
block position i matches the target's greedy token, as the ProVe paper reports it for depths 1–8 and 16. Depths
9–15 are not published: the bench shows no value there, and its plot draws no line across them.
"""

from __future__ import annotations

PROVE_32B_BY_DEPTH: dict[int, float] = {
    1: 0.96, 2: 0.86, 3: 0.79, 4: 0.71, 5: 0.67, 6: 0.59, 7: 0.53, 8: 0.51, 16: 0.27,
}  # fmt: skip
"""Depth (1 = the next token) → share matching greedy, ProVe's published 32B curve (the points it states)."""

PROVE_32B_LABEL = "ProVe 32B, K=16 (published; depths 1–8 and 16 only)"
