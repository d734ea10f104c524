"""Sync-free twins of the pure rules (``prove.decode.rules.block``, ``.speculative``) for the fast path's device cycle
(``prove.decode.engine.device``; docs/design.md §3, "The fast path").

Each twin computes what its rule decides with tensors only: counts are 0-d long tensors, never Python ints, so
nothing reads a value back to the host (no ``.item()``, ``.tolist()``, ``nonzero``) and the shapes depend only on
the block size. The cycle can then run as one captured CUDA graph, and its one small record per cycle is the
only copy to the host. ``tests/decode/test_rules_twins.py`` checks each twin equal to its rule.
"""

from __future__ import annotations

import torch
from prove.decode.rules.block import leading_true
from prove.decode.rules.speculative import speculative_accept_batch


def greedy_match_twin(tokens: torch.Tensor, greedy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``rules.block.greedy_match`` from the target's greedy tokens ``greedy`` (k+1,) (its logits' argmax) over
    the proposal ``tokens`` (k,): (n, extra) as 0-d long tensors — the matching prefix and the correction / bonus
    token g_{n+1}."""
    k = tokens.shape[0]
    n = leading_true(tokens == greedy[:k])  # () long
    return n, greedy.gather(0, n.view(1)).view(())


def sd_sample_twin(
    tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rules.speculative.sd_sample`` given its k + 1 uniforms (u_1..u_k for the accept tests, u_{k+1} for the
    correction / bonus draw): (n, extra) as 0-d long tensors. Its batched core, ``speculative_accept_batch``, is
    already tensors only (no host read, shapes set by k); the twin is that core with the uniforms always given,
    so the device cycle draws them into a buffer and the rule never touches a generator. k = 0 is a sampled AR
    step: the bonus drawn from ``target_probs[0]``. ``draft_probs`` (k, V), ``target_probs`` (k + 1, V)."""
    return speculative_accept_batch(tokens, draft_probs, target_probs, uniforms)


def asd_greedy_twin(
    tokens: torch.Tensor,
    target_logits: torch.Tensor,
    spent: torch.Tensor,
    *,
    budget: float,
    gate: float,
    max_mismatches: int,
    block_size: int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``rules.speculative.asd_greedy`` without its scan: (n, extra, spent) as 0-d tensors, ``spent`` (float64, the
    regret spent so far in the request) in and out. ``block_size`` (K of the gate, default k) may be a 0-d tensor.

    Only the leading run matters, so each position's test can assume every earlier one accepted: y_i passes if it is
    the greedy token, or (with B, g, m all > 0) if r_i ≤ g·(K − i + 1), fewer than m mismatches precede it and the
    regret spent through it is ≤ B. Regrets are the rule's float32 values, summed in float64 in the rule's order
    (the spent regret first), so the comparisons see the rule's numbers."""
    k = tokens.shape[0]
    K = k if block_size is None else block_size
    z = target_logits[:k].float()  # (k, V)
    greedy = target_logits.argmax(-1)  # (k+1,)
    regret = (z.max(-1).values - z.gather(-1, tokens[:, None]).squeeze(-1)).double()  # (k,)
    match = tokens == greedy[:k]  # (k,)
    mis = ~match
    spent_through = torch.cat([spent.view(1), torch.where(mis, regret, 0.0)]).cumsum(
        0
    )  # (k+1,): [s, s+r_1, ..]
    ok = match
    if budget > 0 and gate > 0 and max_mismatches > 0:
        i = torch.arange(1, k + 1, device=tokens.device)
        used_before = mis.long().cumsum(0) - mis.long()  # (k,)
        relaxed = (
            (regret <= gate * (K - i + 1)) & (used_before < max_mismatches) & (spent_through[1:] <= budget)
        )
        ok = match | relaxed
    n = leading_true(ok)
    return n, greedy.gather(0, n.view(1)).view(()), spent_through.gather(0, n.view(1)).view(())


def prove_rule_twin(proposer_conf: torch.Tensor, verifier_probs: torch.Tensor, theta: float) -> torch.Tensor:
    """``rules.block.prove_rule``'s n (k ≥ 1): the leading run of p̃_i·q_i ≥ θ, at least 1 (y_1 always)."""
    return leading_true(proposer_conf * verifier_probs >= theta).clamp(min=1)


def mars_rule_twin(proposer_conf: torch.Tensor, tau: float) -> torch.Tensor:
    """``rules.block.mars_rule``'s n (k ≥ 1): y_1, then the leading run of p̃_i ≥ τ from y_2 on."""
    return 1 + leading_true(proposer_conf[1:] >= tau)


def commit_record(tokens: torch.Tensor, n: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
    """The cycle's record (k + 2,) long: [committed count n + 1, y_1..y_n, extra, then stale ids]: what the host
    reads once per cycle. ``tokens`` (k,), ``n`` and ``extra`` 0-d."""
    row = torch.cat([tokens, tokens.new_zeros(1)])  # (k+1,)
    row = row.scatter(0, n.view(1), extra.view(1))
    return torch.cat([(n + 1).view(1), row])


class GreedyTwin:
    """Greedy matching (``greedy_match_twin``) as the device cycle's rule object: what the self-verified cycles run
    (ar, prove-lossless fused or not, greedy sd, pard). A rule object may hold per-request state on the device
    (``reset`` at a request's start, ``buffers`` saved and restored around a CUDA graph's capture)."""

    def __call__(self, tokens: torch.Tensor, greedy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return greedy_match_twin(tokens, greedy)

    def reset(self) -> None:
        pass

    def buffers(self) -> list[torch.Tensor]:
        return []


class InjectedAcceptance(GreedyTwin):
    """A benchmark's rule (random weights accept nothing): cycle c of a request accepts ``accepted[c % len]`` of its
    proposed tokens (at most all of them) and commits the target's greedy token after them, read from a preloaded
    device buffer after greedy matching has run, so a cycle costs what a real one with that acceptance costs. The
    committed tokens are then not the model's greedy ones."""

    def __init__(self, accepted: list[int], device: torch.device | str) -> None:
        if not accepted or min(accepted) < 0:
            raise ValueError(f"injected acceptance {accepted}: give one count ≥ 0 per cycle")
        self.accepted = torch.tensor(list(accepted), device=device)
        self.at = torch.zeros((), dtype=torch.long, device=device)

    def __call__(self, tokens: torch.Tensor, greedy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        greedy_match_twin(tokens, greedy)  # the rule's full work, its verdict replaced
        n = (
            self.accepted.gather(0, self.at.view(1)).view(()).clamp(max=tokens.shape[0])
        )  # a scalar bound: no copy
        self.at.add_(1).remainder_(self.accepted.shape[0])
        return n, greedy.gather(0, n.view(1)).view(())

    def reset(self) -> None:
        self.at.zero_()

    def buffers(self) -> list[torch.Tensor]:
        return [self.at]
