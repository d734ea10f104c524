"""What a vLLM decode returns (:class:`VllmResult`) and its statistics under our names (:class:`VllmStats`), read off
vLLM's per-request speculative metrics (:func:`vllm_stats`); the adapter itself is :mod:`prove.decode.vllm.backend`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class VllmStats:
    """Per-request statistics of a vLLM decode, under our ``Stats`` names where the meaning is the same.

    ``cycles``: the engine steps that produced this request's tokens: its prefill step (one token) and one step per
    verification (AR: one a token). ``committed_per_cycle``, ``accepted_by_depth``, ``proposed_by_depth``: as ours,
    counting only committed tokens (vLLM's own counts include drafts accepted past a stop string or
    ``max_new_tokens``; they are cut here). vLLM's own figures keep their names: ``drafts`` (its verification steps
    that carried drafts), ``draft_tokens``, ``accepted_tokens`` (accepted draft tokens, before that cut) and
    ``mean_acceptance_length`` = 1 + accepted_tokens / drafts, over drafting steps only — not our
    ``tokens_per_cycle``, which divides every committed token by every cycle."""

    new_tokens: int
    cycles: int
    tokens_per_cycle: float
    committed_per_cycle: list[int]
    accepted_by_depth: list[int]
    proposed_by_depth: list[int]
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    mean_acceptance_length: float
    wall_s: float
    """Arrival to last token of this request in vLLM (with others batched beside it)."""
    backend: str = "vllm"
    proposed_per_cycle: list[int] = dataclasses.field(default_factory=list)
    """The drafts of each verification step (``committed_per_cycle`` after its first entry) that our engine would
    have proposed in that cycle: the step's K, cut as ``proposed_by_depth`` is. Under a K schedule it is the K
    sequence our engine replays to compare (docs/vllm.md, "Under load: a K schedule")."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def vllm_stats(
    new_tokens: int,
    spec: Mapping[str, Any] | None,
    wall_s: float,
    *,
    bonus: bool = True,
    max_new_tokens: int | None = None,
) -> VllmStats:
    """Our stats from vLLM's per-request speculative metrics (``RequestSpecDecodeMetrics.to_dict()`` at the
    ``detailed`` level: ``per_step_accepted`` / ``per_step_drafted``), or from the token count alone (AR).

    vLLM counts a step's accepted drafts as its row's length less one (the bonus or correction token it assumes).
    ``bonus=False``: rows of accepted drafts alone (``prove``: d₁..d_m, no verifier token), so m drafts were
    accepted where vLLM reports m − 1; the step still committed m tokens.

    ``max_new_tokens``: the request's limit. vLLM drafts K a step whatever the request may still take, where our
    proposers propose no more than that (less the correction / bonus token), and our rule inside vLLM scores no more
    (``plugin``'s cut): ``proposed_by_depth`` counts what our engine would have proposed.

    A step vLLM pads with placeholder drafts (a new request with one token to compute beside running ones) is its
    prefill: for ``prove`` / ``nsd`` / ``asd`` the plugin's scheduler leaves it out of vLLM's per-step figures, so
    it counts here as the prefill step it is. vLLM's own methods record it as a drafting step with 0 accepted.

    A step without drafts (K = 0 under a K schedule) is missing from vLLM's per-step figures: the tokens they leave
    uncounted are steps of one token and no draft, appended after the drafting steps (their order among them is
    unknown; ``proposed_per_cycle`` holds a 0 for each)."""
    if spec is None:
        return VllmStats(new_tokens, new_tokens, 1.0, [1] * new_tokens, [], [], 0, 0, 0, 1.0, wall_s)
    commits, taken, drafted = _steps(spec, new_tokens, bonus)
    _cut_past_output(commits, taken, drafted, new_tokens)
    if max_new_tokens is not None:
        drafted, taken = _within_limit(commits, taken, drafted, max_new_tokens, bonus)
    depth = max(drafted, default=0)
    cycles = len(commits)
    return VllmStats(
        new_tokens=new_tokens,
        cycles=cycles,
        tokens_per_cycle=new_tokens / cycles if cycles else 0.0,
        committed_per_cycle=commits,
        accepted_by_depth=_by_depth(taken, depth),
        proposed_by_depth=_by_depth(drafted, depth),
        drafts=int(spec.get("num_spec_steps", 0)),
        draft_tokens=int(spec.get("num_draft_tokens", 0)),
        accepted_tokens=int(spec.get("num_accepted_draft_tokens", 0)),
        mean_acceptance_length=float(spec.get("mean_acceptance_length", 1.0)),
        wall_s=wall_s,
        proposed_per_cycle=drafted,
    )


def _steps(spec: Mapping[str, Any], new_tokens: int, bonus: bool) -> tuple[list[int], list[int], list[int]]:
    """Per step as vLLM reports them: (tokens committed, drafts accepted, drafts made), the prefill step first."""
    accepted = list(spec.get("per_step_accepted", []))
    drafted = list(spec.get("per_step_drafted", []))
    commits = [1] + [a + 1 for a in accepted]  # the prefill step's token, then each step's row
    taken = list(accepted) if bonus else [a + 1 for a in accepted]  # drafts accepted a step
    # steps without drafts (K = 0 under a K schedule) are not in vLLM's per-step figures: one token each, put last
    # (where they fell among the drafting steps is not recorded)
    plain = new_tokens - sum(commits)
    if plain > 0:
        commits, taken, drafted = commits + [1] * plain, taken + [0] * plain, drafted + [0] * plain
    return commits, taken, drafted


def _cut_past_output(commits: list[int], taken: list[int], drafted: list[int], new_tokens: int) -> None:
    """Drop, from the last step back, what vLLM committed beyond the output (cut by a stop or ``max_new_tokens``):
    a step left with no token goes."""
    excess = sum(commits) - new_tokens
    while excess > 0 and len(commits) > 1:
        cut = min(excess, commits[-1])
        commits[-1] -= cut
        taken[-1] = max(0, min(taken[-1], commits[-1]))
        excess -= cut
        if commits[-1] == 0:
            commits.pop(), taken.pop(), drafted.pop()


def _within_limit(
    commits: list[int], taken: list[int], drafted: list[int], max_new_tokens: int, bonus: bool
) -> tuple[list[int], list[int]]:
    """(drafted, taken) cut to what our proposers would have proposed: no more than the request may still take
    after the steps before (less the correction / bonus token)."""
    done = list(itertools.accumulate(commits))  # step s runs after the tokens of the steps before it
    drafted = [max(0, min(d, max_new_tokens - done[s] - int(bonus))) for s, d in enumerate(drafted)]
    taken = [min(a, d) for a, d in zip(taken, drafted, strict=True)]
    return drafted, taken


def _by_depth(counts: list[int], depth: int) -> list[int]:
    """For each depth i < ``depth``: the steps whose count passes it (as ``Stats``' ``*_by_depth``)."""
    return [sum(c > i for c in counts) for i in range(depth)]


@dataclass(frozen=True)
class VllmResult:
    """What ``VllmDecoder.generate`` returns: ``GenerationResult``'s fields, with vLLM's stats."""

    token_ids: list[int]
    """The new tokens only (EOS included when generation ended on it)."""
    text: str
    """Their decoding with special tokens skipped."""
    stats: VllmStats
    top_logprobs: list[list[tuple[int, float]]] | None = None
    """With ``logprobs=k``: per new token, the k most likely ids and their log-probabilities, most likely first —
    vLLM's raw log-probs (a log-softmax of the model's logits over every row, before ``allowed_token_ids``: the
    distribution a teacher-forced forward gives)."""
