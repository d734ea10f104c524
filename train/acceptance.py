"""Acceptance simulated on teacher-forced MARS passes: what prove-lossless (and the MARS rule) would commit per cycle,
read off one ``[noisy | clean]`` forward of held-out rows, no generation (docs/design.md §2.1, "Acceptance while
training"). Pure functions of tensors.

For a block that starts at stream index s (every token of it a response token: s ≥ P, the first response position;
the block holding the prompt/answer boundary is left out) the decode cycle starts at t = s − 1, its context the
clean tokens before s:

- depth 1 is ĝ_{s−1}, the clean stream's argmax at s − 1 (the proposer's own next token, accepted by construction);
- depth d = 2..K′ is the noisy argmax at s + d − 2 (placeholder d − 1 of the block), accepted when it equals
  ĝ_{s+d−2}, the clean argmax there; the noisy in-block index K − 1 (depth K + 1) is trained but never decoded;
- ĝ_{s+d−2} is what verification computes only if the tokens before it are the ones committed, so a leading run
  counts only while the labels inside it are the clean argmax (x_{j+1} = ĝ_j); a block whose labels differ from the
  clean argmax within its reach (in-block indices 0..K − 2: the last label precedes no proposal) is *off-policy*
  (counted apart: their share says how far the data is from the model's own outputs);
- prove-lossless commits run + 1 tokens (the run of accepted depths, then the correction or bonus token), never past
  the end-of-turn token (EOS block padding is never counted: a block that starts past it is no cycle); the MARS rule
  commits 1 + the run of depths 2.. whose confidence p̃ (the noisy argmax's probability) reaches τ, no bonus token.

Every K′ ≤ K is read from the same pass: decoding at K′ uses the first K′ depths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from prove.data.chat import IGNORE_INDEX


@dataclass(frozen=True)
class AcceptanceSums:
    """Counts over blocks (sums, so batches and ranks add up: :meth:`as_tensor` / :meth:`from_tensor`)."""

    blocks: torch.Tensor
    """``()`` blocks counted (cycles simulated)."""
    offpolicy: torch.Tensor
    """``()`` of them whose labels within reach differ from the clean argmax."""
    depth_blocks: torch.Tensor
    """``(K,)`` blocks in which depth d = 1..K lies before the end of turn."""
    depth_hits: torch.Tensor
    """``(K,)`` of them whose run reaches depth d."""
    tokens: torch.Tensor
    """``(K,)`` prove-lossless tokens committed, summed over blocks, decoding at K′ = 1..K."""
    mars_tokens: torch.Tensor
    """``(K,)`` the same under the MARS rule (p̃ ≥ τ, no bonus token)."""
    inv_tokens: torch.Tensor
    """``(K,)`` Σ over blocks of m / n, m the block's positions up to the end of turn (at most K) and n the
    prove-lossless tokens it commits at K′ = 1..K: the cycles a decode walking it would spend (below)."""
    walk_depth_hits: torch.Tensor
    """``(K,)`` Σ over blocks of (run reaches depth d) · m / n at K′ = K: the walk's per-depth hits."""
    positions: torch.Tensor
    """``()`` Σ m over blocks: the response positions the blocks cover."""

    def as_tensor(self) -> torch.Tensor:
        """One float64 vector ``(3 + 6K,)``."""
        head = torch.stack([self.blocks, self.offpolicy, self.positions]).double()
        rest = [
            self.depth_blocks,
            self.depth_hits,
            self.tokens,
            self.mars_tokens,
            self.inv_tokens,
            self.walk_depth_hits,
        ]
        return torch.cat([head, *(r.double() for r in rest)])

    @staticmethod
    def from_tensor(t: torch.Tensor) -> AcceptanceSums:
        k = (t.numel() - 3) // 6
        parts = t[3:].view(6, k)
        return AcceptanceSums(t[0], t[1], parts[0], parts[1], parts[2], parts[3], parts[4], parts[5], t[2])

    def __add__(self, other: AcceptanceSums) -> AcceptanceSums:
        return AcceptanceSums.from_tensor(self.as_tensor() + other.as_tensor().to(self.blocks.device))

    def summary(self) -> dict[str, float]:
        """``accept_d{d}`` (per-depth acceptance), ``tpc_k{K′}`` (simulated prove-lossless tokens per cycle),
        ``tpc_mars_k{K′}`` (the MARS rule's), ``tpc_walk_k{K′}`` (prove-lossless walked as the decoder walks, estimated:
        below), ``offpolicy`` (share of blocks) and ``blocks``.

        ``tpc_k`` is a mean over blocks aligned every K tokens: every stretch of the response counts once. A decode
        starts each cycle where the last one ended, so it spends more cycles where blocks commit little: its tokens
        per cycle are tokens / cycles, and a block committing n tokens stands for its m positions (K, fewer at the
        end of turn) walked in m / n cycles. ``tpc_walk_k`` = Σ m / Σ m / n, a harmonic mean, is that count (exact
        when n changes slower than a cycle's length; at K = 16 an easy half at n = 17 and a hard half at n = 2 give
        9.5 aligned but 3.6 walked)."""
        n = float(self.blocks)
        out: dict[str, float] = {"blocks": n, "offpolicy": float(self.offpolicy) / max(n, 1.0)}
        k = self.tokens.numel()
        for d in range(k):
            out[f"accept_d{d + 1}"] = float(self.depth_hits[d]) / max(float(self.depth_blocks[d]), 1.0)
        for d in range(k):
            out[f"tpc_k{d + 1}"] = float(self.tokens[d]) / max(n, 1.0)
        for d in range(k):
            out[f"tpc_mars_k{d + 1}"] = float(self.mars_tokens[d]) / max(n, 1.0)
        for d in range(k):
            inv = float(self.inv_tokens[d])
            out[f"tpc_walk_k{d + 1}"] = float(self.positions) / inv if inv > 0 else 0.0
        return out

    def walk_accept_by_depth(self) -> list[float]:
        """Per-depth acceptance at depths 1..K as a decode at K′ = K counts it (accepted / cycles; a depth past the
        end of turn is proposed, not accepted), each block weighted by the cycles a walk spends in it (m / n): the
        walk's estimate beside the aligned ``depth_hits / blocks``."""
        inv = float(self.inv_tokens[-1])
        return [float(h) / inv if inv > 0 else 0.0 for h in self.walk_depth_hits]


def allowed_argmax(logits: torch.Tensor, allowed: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Argmax and its probability over the ids decoding may output (``allowed`` ``(V,)`` bool: no ``<|mask|>``, no
    spare embedding rows), as the decode engine restricts them. ``logits`` ``(..., V)`` → two ``(...)`` tensors."""
    z = logits.float()
    if allowed is not None:
        z = z.masked_fill(~allowed.to(z.device), float("-inf"))
    probs = torch.softmax(z, dim=-1)
    conf, idx = probs.max(dim=-1)
    return idx, conf


def response_span(labels: torch.Tensor, stop_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row ``(P, e)``, both ``(B,)``: the first labelled position, and the last a decode may commit (the first
    end-of-turn label, else the last label)."""
    length = labels.shape[1]
    pos = torch.arange(length, device=labels.device)
    has = labels != IGNORE_INDEX  # (B, L)
    first = torch.where(has, pos, length).min(dim=1).values  # (B,) P
    stop = torch.zeros_like(has)
    for t in stop_ids:
        stop |= labels == t
    stop &= has
    last = torch.where(has, pos, -1).max(dim=1).values  # (B,) the last label
    eot = torch.where(stop, pos, length).min(dim=1).values  # (B,)
    return first, torch.where(eot < length, eot, last)


def by_block(x: torch.Tensor, k: int, shift: int = 0) -> torch.Tensor:
    """``x`` ``(B, L)`` read at s + i + ``shift`` for every block start s and in-block index i: ``(B, C, K)``
    (a position before 0 reads 0)."""
    bsz, length = x.shape
    c = length // k
    s = torch.arange(c, device=x.device) * k  # (C,) block starts
    i = torch.arange(k, device=x.device)  # (K,) in-block index
    at = (s[:, None] + i[None, :] + shift).clamp(min=0).expand(bsz, c, k).reshape(bsz, -1)
    return x.gather(1, at).view(bsz, c, k)


def leading_runs(
    proposal_ok: torch.Tensor, label_ok: torch.Tensor, confident: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From ``(B, C, K)`` tests at in-block index i — the noisy argmax there equals the clean one (depth i + 2), the
    label there is the clean argmax before it, the noisy argmax's p̃ reaches τ — the accepted depths ``(B, C, K)``
    (depth d at index d − 1: depth 1 always, depth d while every proposal and label before it holds), the
    prove-lossless run ``(B, C)`` and the MARS rule's ``(B, C)``, each 1..K."""
    k = proposal_ok.shape[-1]
    ones = torch.ones_like(proposal_ok[..., :1])
    proposed = torch.cat([ones, proposal_ok[..., : k - 1]], dim=-1)
    labels_before = torch.cat(
        [ones, label_ok.cumprod(dim=-1).bool()[..., : k - 1]], dim=-1
    )  # of y_1..y_{d−1}
    accepted = (proposed & labels_before).cumprod(dim=-1)  # leading run
    mars_ok = torch.cat([ones, confident[..., : k - 1]], dim=-1).cumprod(dim=-1)
    return accepted, accepted.sum(dim=-1), mars_ok.sum(dim=-1)


def block_acceptance(
    clean_pred: torch.Tensor,
    noisy_pred: torch.Tensor,
    noisy_conf: torch.Tensor,
    labels: torch.Tensor,
    block_size: int,
    stop_ids: Sequence[int],
    tau: float = 0.95,
) -> AcceptanceSums:
    """The sums of :class:`AcceptanceSums` for a batch (the rule in the module docstring).

    All ``(B, L)``, indexed by position within the stream (L a multiple of K): ``clean_pred[b, j]`` the clean
    stream's argmax at j (its guess for j + 1), ``noisy_pred`` / ``noisy_conf`` the noisy stream's argmax and its
    probability at j (read only at response blocks), ``labels`` −100 on the prompt and batch padding. ``stop_ids``:
    the end-of-turn ids (the first one in the response ends it; a row without one ends at its last label)."""
    bsz, length = labels.shape
    k = block_size
    assert length % k == 0, f"length {length} is not a multiple of K = {k}"
    first, eot = response_span(labels, stop_ids)  # (B,) each
    lab = by_block(labels, k)  # x_{s+i}
    labels_on_policy = lab == by_block(clean_pred, k, -1)  # x_{s+i} = ĝ_{s+i−1}, the greedy guess for s + i
    proposal_ok = by_block(noisy_pred, k) == by_block(
        clean_pred, k
    )  # noisy argmax at s + i (depth i + 2) = ĝ_{s+i}
    accepted, run, mars_run = leading_runs(proposal_ok, labels_on_policy, by_block(noisy_conf, k) >= tau)

    i = torch.arange(k, device=labels.device)  # (K,) in-block index
    starts = (torch.arange(length // k, device=labels.device) * k).expand(bsz, -1)  # (B, C) block starts s
    cap = eot[:, None] - starts + 1  # (B, C) tokens up to and with the end of turn
    counted = (starts >= first[:, None]) & (starts >= 1) & (cap >= 1) & lab.ne(IGNORE_INDEX)[..., 0]  # (B, C)
    within = i[None, None, :] < cap[..., None].clamp(max=k)  # (B, C, K) positions a cycle may commit
    # the labels a run reads: those of y_1..y_{K−1} (in-block index K − 1 precedes no proposal: it never cuts one)
    offpolicy = ((~labels_on_policy) & within)[..., : k - 1].any(dim=-1) & counted

    depth = i + 1  # (K,)
    reach = (cap[..., None] >= depth) & counted[..., None]  # (B, C, K) depth d before the end of turn
    kk = depth[None, None, :]  # K′ = 1..K
    tokens = torch.minimum(torch.minimum(run[..., None], kk) + 1, cap[..., None])  # (B, C, K′)
    mars_tokens = torch.minimum(torch.minimum(mars_run[..., None], kk), cap[..., None])
    w = counted[..., None].to(torch.float64)
    covered = cap.clamp(max=k).double()[..., None] * w  # (B, C, 1) m: positions up to the end of turn
    inv = covered / tokens.clamp(min=1).double()  # (B, C, K′) cycles a walk spends there (0: not counted)
    hit = (reach & accepted.bool()).double()  # (B, C, K)
    return AcceptanceSums(
        blocks=counted.sum().double(),
        offpolicy=offpolicy.sum().double(),
        depth_blocks=reach.sum(dim=(0, 1)).double(),
        depth_hits=(reach & accepted.bool()).sum(dim=(0, 1)).double(),
        tokens=(tokens.double() * w).sum(dim=(0, 1)),
        mars_tokens=(mars_tokens.double() * w).sum(dim=(0, 1)),
        inv_tokens=inv.sum(dim=(0, 1)),
        walk_depth_hits=(hit * inv[..., -1:]).sum(dim=(0, 1)),
        positions=covered.sum(),
    )
