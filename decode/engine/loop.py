"""The loop (docs/design.md §3): advance a cycle → commit where AR would stop → sync the caches → count, for every
method and both kinds of cycle.

A method differs only in its proposer, its verifier and its pure rule (``prove.decode.methods``), composed on the
host by ``ComposedCycle``, or run as one device function with the rule's sync-free twin by the device cycle
(``prove.decode.engine.device.FastEngine``). AR is the method whose proposer proposes nothing and whose verifier (the
model itself) yields the next token, so the speed baseline runs through this same loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from prove.decode.engine.cache import native_gqa
from prove.decode.engine.runner import ModelRunner
from prove.decode.sampling import token_prob

if TYPE_CHECKING:
    from prove.decode.methods import Method
    from prove.decode.proposers.base import Proposal, Proposer
    from prove.decode.rules.base import Accept
    from prove.decode.verifiers import Verifier


def device_sync(device: torch.device | str) -> None:
    """Wait for the device's queued work (CUDA kernels run asynchronously): what brackets every timing."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Models:
    """The runners a method may use. ``target`` is the model being accelerated (``model=``)."""

    target: ModelRunner
    verifier: ModelRunner | None = None
    draft: ModelRunner | None = None
    mask_token_id: int | None = None
    allowed: torch.Tensor | None = None
    """(V,) bool over the target's logit rows: the ids a proposer may propose and a rule may commit. False for
    ``<|mask|>`` and for ids some model cannot score or the tokenizer does not have (set by the Decoder)."""

    def runners(self) -> list[ModelRunner]:
        return [r for r in (self.target, self.verifier, self.draft) if r is not None]


def end_of_turn_ids(generation_eos: int | Sequence[int] | None, tokenizer_eos: int | None) -> list[int]:
    """The ids that end an answer, sorted: the union of the model's generation config's EOS id(s) and the
    tokenizer's EOS (a chat model's generation config often names only its end-of-turn token, its tokenizer another
    end). The one definition: the decoders stop on it, and stage mars's simulated acceptance ends a row on it."""
    ids = [generation_eos] if isinstance(generation_eos, int) else list(generation_eos or ())
    if tokenizer_eos is not None:
        ids.append(tokenizer_eos)
    return sorted({int(t) for t in ids})


class Stopper:
    """Ends the output exactly where AR decoding would: at the first EOS (included), at the token that
    completes a stop string (included), or at ``max_new_tokens``."""

    def __init__(
        self,
        max_new_tokens: int,
        eos_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        decode: Callable[[list[int]], str] | None = None,
    ) -> None:
        if stop and decode is None:
            raise ValueError("stop strings need a tokenizer: pass tokenizer= to the Decoder")
        self.max_new_tokens = max_new_tokens
        self.eos = set(eos_token_ids)
        self.stop = [s for s in stop if s]
        self.decode = decode
        self._text_len = 0

    def commit(self, new: list[int], tokens: Sequence[int]) -> bool:
        """Append ``tokens`` to ``new`` one by one until a stop condition; True if generation is over."""
        for t in tokens:
            new.append(int(t))
            if int(t) in self.eos or len(new) >= self.max_new_tokens or self._hit_stop(new):
                return True
        return False

    def _hit_stop(self, new: list[int]) -> bool:
        if not self.stop:
            return False
        assert self.decode is not None
        text = self.decode(new)
        start = max(0, self._text_len - max(len(s) for s in self.stop))
        self._text_len = len(text)
        return any(s in text[start:] for s in self.stop)


@dataclass(frozen=True)
class Stats:
    """Per-request statistics (docs/design.md §3).

    ``tokens_per_cycle`` = new_tokens / cycles: the mean committed length, which counts the correction
    or bonus token of rules that add one (so AR is 1.0). ``model_passes`` counts every forward pass of
    ``model`` (block passes and self-verification passes alike), ``verifier_passes`` those of a separate
    verifier model, ``draft_passes`` those of a draft model. ``accepted_by_depth[i]`` is the number of
    cycles in which proposed position i (0-based) was accepted by the rule and committed (not cut off by EOS,
    a stop string or ``max_new_tokens``), ``proposed_by_depth[i]`` the
    number in which it was proposed. ``trace`` (only when asked for) has one dict per cycle with, per
    proposed position, ``conf`` (p̃), ``verifier_prob`` (q, from the verifier model when there is one),
    ``target_prob`` and ``matched`` (y_i equals the target's greedy token; only when the target scored
    the block), and ``accepted``.
    """

    new_tokens: int
    cycles: int
    tokens_per_cycle: float
    model_passes: int
    verifier_passes: int
    draft_passes: int
    accepted_by_depth: list[int]
    proposed_by_depth: list[int]
    committed_per_cycle: list[int]
    wall_s: float
    model_s: float = 0.0
    """Of ``wall_s``, the seconds inside the models' forward passes (``ModelRunner.model_s``); the rest is the
    engine's own work: proposing from logits, the rule, commits, cache crops."""
    padded_passes: int = 0
    """Passes, all models together, run wider than their tokens (``pad_widths=auto``, ``prove.decode.engine.padding``)."""
    trace: list[dict[str, Any]] | None = None
    fast: dict[str, int] | None = None
    """Only when the device cycle ran (``prove.decode.engine.device``): its counters for this request — ``cycles``,
    ``graph_replays`` (CUDA graphs replayed), ``eager_cycles`` (cycles of another width, run without the graph),
    ``syncs`` (host reads of the device), ``passes`` (prefill included; a full-width last cycle counted as the
    reference runs it, narrowed to the budget), ``captures`` (CUDA graphs captured),
    ``dropped_cycles`` (launched ahead for a request that had ended), ``draft_passes`` / ``verifier_passes`` (of a
    draft / a ProVe verifier, prefill excluded), ``graphs`` (1 if graphs were on)."""

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (``trace`` and ``fast`` only when present): what output records store."""
        d = asdict(self)
        for key in ("trace", "fast"):
            if d[key] is None:
                del d[key]
        return d


@dataclass(frozen=True)
class CycleView:
    """What a method's rule adapter sees in one cycle."""

    proposal: Proposal
    target_logits: torch.Tensor | None
    """(k+1, V) teacher-forced logits of the target (verifier ``self``) over y_1..y_k, or None; with a
    ``proposal.branch`` (b, z), followed by the k−b rows of the branch [z, y_{b+2}..y_k]."""
    verifier_logits: torch.Tensor | None
    """(k+1, V) teacher-forced logits of a separate verifier model (verifier ``small``), or None."""
    params: Any
    """The resolved ``DecodeParams``."""
    generator: torch.Generator | None
    state: dict[str, Any]
    """Mutable per-request state for rules with budgets that span cycles (e.g. ASD's regret budget)."""


@dataclass(frozen=True)
class CycleEvent:
    """Passed to ``on_cycle`` after each commit (and cache sync): a debugging/observation hook."""

    cycle: int
    seq: list[int]
    """The whole committed sequence (prompt + new tokens)."""
    prompt_len: int
    proposal: Proposal
    accept: Accept
    committed: list[int]
    models: Models
    done: bool


@dataclass
class Tally:
    """What a request's cycles committed and accepted, by cycle and by proposed position (``Stats``' lists)."""

    committed_per_cycle: list[int] = field(default_factory=list)
    accepted_by_depth: list[int] = field(default_factory=list)
    proposed_by_depth: list[int] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)

    def count(self, k: int, accepted: int) -> None:
        grow = k - len(self.proposed_by_depth)
        if grow > 0:
            self.proposed_by_depth += [0] * grow
            self.accepted_by_depth += [0] * grow
        for i in range(k):
            self.proposed_by_depth[i] += 1
            self.accepted_by_depth[i] += i < accepted

    def stats(
        self, new_tokens: int, passes: Passes, wall_s: float, *, fast: dict[str, int] | None, trace: bool
    ) -> Stats:
        """The request's ``Stats``: what was counted here, with the cycle's passes and the wall time."""
        cycles = len(self.committed_per_cycle)
        return Stats(
            new_tokens=new_tokens,
            cycles=cycles,
            tokens_per_cycle=new_tokens / max(cycles, 1),
            model_passes=passes.model,
            verifier_passes=passes.verifier,
            draft_passes=passes.draft,
            accepted_by_depth=self.accepted_by_depth,
            proposed_by_depth=self.proposed_by_depth,
            committed_per_cycle=self.committed_per_cycle,
            wall_s=wall_s,
            model_s=passes.model_s,
            padded_passes=passes.padded,
            trace=self.trace if trace else None,
            fast=fast,
        )


def _trace_row(view: CycleView, accept: Accept) -> dict[str, Any]:
    prop = view.proposal
    tokens = prop.tokens
    k = tokens.shape[0]
    row: dict[str, Any] = {"tokens": tokens.tolist(), "conf": prop.conf.tolist(), "accepted": accept.n}
    row["verifier_prob"] = None
    row["target_prob"] = None
    row["matched"] = None
    if view.verifier_logits is not None:
        row["verifier_prob"] = token_prob(view.verifier_logits, tokens).tolist()
    if view.target_logits is not None:
        row["target_prob"] = token_prob(view.target_logits, tokens).tolist()
        row["matched"] = (view.target_logits[:k].argmax(-1) == tokens).tolist()
    return row


@dataclass(frozen=True)
class Step:
    """One cycle's outcome, whichever kind of cycle ran it: ``proposed`` tokens, of which the rule ``accepted`` a
    leading run, and the ``tokens`` to commit (the accepted ones and the rule's correction / bonus token). A composed
    cycle also hands over what it saw (for ``trace`` and ``on_cycle``)."""

    proposed: int
    accepted: int
    tokens: list[int]
    proposal: Proposal | None = None
    view: CycleView | None = None
    accept: Accept | None = None


@dataclass(frozen=True)
class Passes:
    """A request's passes per model and the seconds inside them (``Stats``' counts)."""

    model: int
    verifier: int
    draft: int
    model_s: float
    padded: int = 0


class Cycle(Protocol):
    """A kind of cycle the loop (``run``) runs: ``ComposedCycle`` (any method: proposer, verifier and pure rule on the
    host) or the device cycle (``prove.decode.engine.device.FastEngine``: a method's rule twin, no host sync inside a cycle;
    CUDA graphs and ``torch.compile`` are its options). Both keep their models' K/V in slot caches."""

    adds_token: bool
    """The rule commits a correction / bonus token after the accepted ones (a target verifies)."""

    def begin(self, prompt: list[int], stopper: Stopper) -> None: ...

    def advance(self, seq: list[int], left: int) -> Step: ...

    def sync(self, seq: list[int]) -> None: ...

    def end(self) -> tuple[Passes, dict[str, int] | None]: ...

    def torch_models(self) -> list[Any]: ...


class ComposedCycle:
    """The cycle composed from a method's parts: propose (``proposer``), score (one teacher-forced pass of
    ``verifier`` over [pending, y_1..y_k]), accept (the method's pure rule, on the host). ``probe`` is an optional
    extra verifier (a separate verifier model on a method that does not use one) that only the trace reads: it runs
    on its own cache, so it never changes the output."""

    def __init__(
        self,
        models: Models,
        method: Method,
        proposer: Proposer,
        verifier: Verifier,
        *,
        params: Any,
        generator: torch.Generator | None = None,
        probe: Verifier | None = None,
    ) -> None:
        self.models, self.method, self.proposer, self.verifier = models, method, proposer, verifier
        self.params, self.generator, self.probe = params, generator, probe
        self.adds_token = bool(verifier.is_target)
        self.state: dict[str, Any] = {}

    def _distinct(self) -> list[ModelRunner]:
        return list({id(r): r for r in self.models.runners()}.values())

    def begin(self, prompt: list[int], stopper: Stopper) -> None:
        for runner in self.models.runners():
            runner.reset()
        self._start = {id(r): (r.passes, r.model_s, r.padded) for r in self._distinct()}
        if hasattr(
            self.proposer, "stop_tokens"
        ):  # a proposer drafting token by token stops at the request's EOS
            self.proposer.stop_tokens = frozenset(stopper.eos)
        self.state = {}  # a rule's per-request state (ASD's regret budget) starts fresh

    def advance(self, seq: list[int], left: int) -> Step:
        # Tokens the proposal may hold: what the request may still take, less the correction / bonus token that a
        # rule verified by the target always adds (so a proposal never outruns max_new_tokens).
        proposal = self.proposer.propose(seq, left - int(self.adds_token))
        scored = self.verifier.score(seq, proposal.tokens)
        probed = self.probe.score(seq, proposal.tokens) if self.probe is not None else None
        view = CycleView(
            proposal=proposal,
            target_logits=scored if self.verifier.is_target else None,
            verifier_logits=scored if not self.verifier.is_target else probed,
            params=self.params,
            generator=self.generator,
            state=self.state,
        )
        accept = self.method.accept(view)
        assert 0 <= accept.n <= proposal.k, f"rule accepted {accept.n} of {proposal.k}"
        accepted = list(accept.path) if accept.path is not None else proposal.tokens[: accept.n].tolist()
        assert len(accepted) == accept.n, "a rule's path holds its n accepted tokens"
        tokens = accepted + ([accept.extra] if accept.extra is not None else [])
        return Step(proposal.k, accept.n, tokens, proposal, view, accept)

    def sync(self, seq: list[int]) -> None:
        for runner in self.models.runners():
            runner.sync(seq)

    def end(self) -> tuple[Passes, None]:
        def passes(r: ModelRunner | None) -> int:
            return 0 if r is None else r.passes - self._start[id(r)][0]

        m = self.models
        distinct = self._distinct()
        return (
            Passes(
                model=passes(m.target),
                verifier=passes(m.verifier) if m.verifier is not m.target else 0,
                draft=passes(m.draft),
                model_s=sum(r.model_s - self._start[id(r)][1] for r in distinct),
                padded=sum(r.padded - self._start[id(r)][2] for r in distinct),
            ),
            None,
        )

    def torch_models(self) -> list[Any]:
        return [r.model for r in self._distinct()]


def run(
    prompt_ids: Sequence[int],
    *,
    cycle: Cycle,
    stopper: Stopper,
    trace: bool = False,
    on_cycle: Callable[[CycleEvent], None] | None = None,
    models: Models | None = None,
    name: str = "the method",
) -> tuple[list[int], Stats]:
    """Decode one request: the one loop of every method and every kind of cycle — advance a cycle, commit its tokens
    where AR would stop (``stopper``), sync the caches to the committed sequence, count. Returns the new token ids
    and the request's stats. ``trace`` and ``on_cycle`` read what a ``ComposedCycle`` saw (``models``: what
    ``CycleEvent`` hands the hook)."""
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty: give at least one token")
    seq = [int(t) for t in prompt_ids]
    new: list[int] = []
    tally = Tally()
    done = False
    with torch.no_grad(), native_gqa(*cycle.torch_models()):
        t0 = time.perf_counter()
        cycle.begin(list(seq), stopper)
        while not done:
            step = cycle.advance(seq, stopper.max_new_tokens - len(new))
            before = len(new)
            done = stopper.commit(new, step.tokens)
            committed = new[before:]
            seq.extend(committed)
            cycle.sync(seq)
            tally.committed_per_cycle.append(len(committed))
            tally.count(step.proposed, min(step.accepted, len(committed)))  # what was committed, not cut off
            if trace and step.view is not None and step.accept is not None:
                tally.trace.append(_trace_row(step.view, step.accept))
            if on_cycle is not None:
                assert step.proposal is not None and step.accept is not None and models is not None
                cycles = len(tally.committed_per_cycle) - 1
                event = CycleEvent(
                    cycles, list(seq), len(prompt_ids), step.proposal, step.accept, committed, models, done
                )
                on_cycle(event)
            if not committed and not done:
                raise RuntimeError(
                    f"method {name} committed nothing in a cycle; its rule must commit ≥ 1 token"
                )
        passes, fast = cycle.end()
        wall = time.perf_counter() - t0
    return new, tally.stats(len(new), passes, wall, fast=fast, trace=trace)
