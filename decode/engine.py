"""The cycle engine (docs/design.md §3): propose → score → accept → commit, for every method.

One loop serves every method; a method differs only in its proposer, its verifier and its pure rule
(``prove.decode.methods``). AR is the method whose proposer proposes nothing and whose verifier (the
model itself) yields the next token, so the speed baseline runs through this same loop.

KV-cache invariant. Each model is wrapped in a ``ModelRunner`` that records which token was fed at every
cache position. A cache entry is valid iff every token fed up to it equals the committed sequence
there (causal attention: the entry depends on nothing later). After every cycle each runner crops its
cache to that valid prefix, so it holds exactly the KV that AR decoding over the committed tokens would
hold; entries computed from placeholders (``<|mask|>``) or from rejected tokens are dropped, and
committed tokens without valid KV are "pending": fed at the front of the runner's next pass.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from prove.decode.memo import IdentityMemo
from prove.decode.sampling import token_prob
from prove.decode.slot_cache import (
    SlotCache,
    attention_window,
    linear_see,
    native_gqa,
    pass_mask,
    slot_mask,
)

if TYPE_CHECKING:
    from prove.decode.methods import Method
    from prove.decode.proposers.base import Proposal, Proposer
    from prove.decode.rules.base import Accept
    from prove.decode.verifiers import Verifier


class ModelRunner:
    """A causal LM, its slot cache (``prove.decode.slot_cache.SlotCache``) and the tokens its entries were computed
    from: entry i sits at slot i, so a crop is a length, and a pass attends exactly the entries it may see."""

    def __init__(self, model: torch.nn.Module, name: str = "model", *, capacity: int | None = None) -> None:
        self.model: Any = model  # a transformers PreTrainedModel (its stubs type attributes loosely)
        self.name = name
        self.passes = 0
        self.model_s = 0.0
        """Seconds spent inside the model's forward, all passes together (host time: on a GPU, whose kernels run
        asynchronously, it counts launches, not the kernels)."""
        self._logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._trees: IdentityMemo[tuple[torch.Tensor, torch.Tensor]] = IdentityMemo(TREE_MEMO)
        self.pad_to: dict[int, int] = {}
        """Widths at which a linear pass runs wider, {w: w'} (``prove.decode.padding``; empty = never)."""
        self.padded = 0
        """Passes run wider than their tokens (all requests together, as ``passes``)."""
        self.cache = SlotCache.for_model(model, capacity or INITIAL_SLOTS)
        """Allocated at the first pass and kept across requests; grows (contents kept) when a pass needs more."""
        self.cache.compileable = False  # an eager pass: a one-row pass that sees every slot may run unmasked
        self.reset()

    @property
    def device(self) -> torch.device:
        return self._param.device

    @property
    def dtype(self) -> torch.dtype:
        return self._param.dtype

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    def reset(self) -> None:
        """Forget everything (a new request): what the slots hold is stale from here on."""
        self._param = next(self.model.parameters())  # where and in what dtype the model runs (read per pass)
        self.cache.length = 0
        self.fed: list[int] = []  # token fed at each cache slot
        self.valid = 0  # fed[:valid] is known to equal the committed sequence
        self._rows: tuple[int, torch.Tensor] | None = None
        """The last linear pass's logits (rows, V) and the prefix length its row 0 follows: row j predicts the
        token after ``fed[:start + j]`` (``_known_row``)."""
        self._unmaskable = attention_window(self.model.config)[0] is None
        """A one-row pass at the last slot in use sees every slot: it runs with no mask (transformers then builds
        none, or the causal one, which is the same; sdpa's unmasked kernel is the cheaper one on a CPU)."""

    @property
    def cached(self) -> int:
        return len(self.fed)

    def _valid_prefix(self, seq: Sequence[int]) -> int:
        v = self.valid
        limit = min(len(self.fed), len(seq))
        while v < limit and self.fed[v] == seq[v]:
            v += 1
        return v

    def _crop(self, keep: int) -> None:
        del self.fed[keep:]
        self.cache.length = len(self.fed)
        self.valid = keep

    def sync(self, seq: Sequence[int]) -> None:
        """Crop the cache to the entries valid for the committed sequence ``seq``."""
        self._crop(self._valid_prefix(seq))

    @torch.no_grad()
    def forward(
        self, seq: Sequence[int], extra: Sequence[int] = (), *, committed: int | None = None
    ) -> torch.Tensor:
        """One pass over ``[pending, extra]`` with a plain causal mask, where pending = the tokens of
        ``seq`` without valid KV (at least the last one, so that row 0 of the result predicts the token
        after ``seq``).

        ``committed`` (default ``len(seq)``): only ``seq[:committed]`` is committed, the rest is a
        speculative continuation (a draft model extending its own proposal one pass at a time). Its KV is
        kept and reused by the next pass while it matches, but it is not marked valid: the engine's
        ``sync`` keeps it only where the committed sequence turns out to agree.

        Returns logits (len(extra) + 1, V): row i predicts the token after ``seq + extra[:i]``.

        When every token of ``seq`` is already in the cache and the last linear pass computed the logits after
        ``seq`` (a self-verification right after the block pass that fed the same pending token; a verifier
        whose previous pass fed the drafts just committed), row 0 is that pass's and this pass feeds only
        ``extra``: one position narrower, with the same logits up to rounding.
        """
        valid = len(seq) if committed is None else min(committed, len(seq))
        known = self._known_row(seq) if extra else None
        if known is not None:
            self._crop(len(seq))
            new = list(extra)
            logits = torch.cat([known[None], self._pass(new, len(seq), rows=len(new), fed=new, valid=valid)])
        else:
            keep = self._start(seq)
            new = list(seq[keep:]) + list(extra)
            logits = self._pass(new, keep, rows=len(extra) + 1, fed=new, valid=valid)
        self._rows = (len(seq), logits)
        return logits

    def _known_row(self, seq: Sequence[int]) -> torch.Tensor | None:
        """The last linear pass's logits after ``seq``, if every token of ``seq`` is in the cache as fed then
        (a crop since only shortens ``fed``; any pass replaces ``_rows``)."""
        if self._rows is None:
            return None
        start, logits = self._rows
        j = len(seq) - start
        if not 0 <= j < logits.shape[0] or self._valid_prefix(seq) < len(seq):
            return None
        return logits[j]

    @torch.no_grad()
    def forward_tree(
        self,
        seq: Sequence[int],
        extra: Sequence[int],
        *,
        offsets: torch.Tensor,
        attend: torch.Tensor,
        chain: int,
    ) -> torch.Tensor:
        """One pass over ``[pending, extra]`` where ``extra`` is a tree rather than a continuation (the fused
        verify-and-draft pass, ``prove.decode.fused``): entry e sits at position ``len(seq) + offsets[e]``
        and attends the cache, the pending tokens and the entries ``attend[e]`` (E, E) allows.

        Only the first ``chain`` entries continue ``seq`` causally (their KV is what AR would hold if they
        get committed); the others are recorded as ``SKIPPED`` in ``fed``, so ``sync`` never keeps them.
        Returns logits (len(extra) + 1, V): row 0 predicts the token after ``seq``, row 1 + e is entry e's.
        """
        assert 0 <= chain <= len(extra) == offsets.shape[0] == attend.shape[0]
        keep = self._start(seq)
        self._rows = None  # a tree's rows past its chain follow no linear prefix
        pending = list(seq[keep:])
        tree = self._tree_parts(len(pending), offsets, attend)
        fed = pending + list(extra[:chain]) + [SKIPPED] * (len(extra) - chain)
        return self._pass(
            pending + list(extra), keep, rows=len(extra) + 1, fed=fed, valid=len(seq), tree=tree
        )

    def _tree_parts(
        self, pending: int, offsets: torch.Tensor, attend: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A tree's positions relative to its first new entry (P+E,) and which new entry each may see (P+E, P+E),
        on the runner's device: built once per (tree, pending count) and reused (a decode feeds a handful of trees;
        building the mask was a tenth of a fused cycle's non-model time on the demo)."""
        device = self.device

        def build() -> tuple[torch.Tensor, torch.Tensor]:
            rel = torch.cat([torch.arange(pending), offsets.cpu() + pending]).to(device)
            return rel, tree_local(pending, attend).to(device)

        return self._trees.get((offsets, attend), (pending, device), build)

    def _start(self, seq: Sequence[int]) -> int:
        """Crop the cache to its valid prefix of ``seq``, less the last token (always fed, so that the pass's
        first row predicts the token after ``seq``); returns the number of entries kept."""
        keep = min(self._valid_prefix(seq), len(seq) - 1)
        self._crop(keep)
        return keep

    def _pass(
        self,
        tokens: list[int],
        start: int,
        *,
        rows: int,
        fed: list[int],
        valid: int,
        tree: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The model over ``tokens`` written at slots start.. of the cache (the valid prefix below ``start``, at slot
        = position): a causal continuation at positions start.., or a ``tree`` (its positions relative to ``start``
        and its (W, W) bool "entry may see entry"); records ``fed`` and ``valid``, returns the logits of the last
        ``rows`` tokens (rows, V)."""
        # a linear pass at a width this device runs slower than a wider one: filler after the real tokens (no real
        # row sees it under the causal mask), its rows dropped and its slots left stale right after
        pad = self.pad_to.get(len(tokens), len(tokens)) - len(tokens) if tree is None else 0
        if pad > 0:
            tokens = tokens + [tokens[-1]] * pad
        width = len(tokens)
        end = start + width
        if end > self.cache.capacity:
            self.cache.grow(max(end, 2 * self.cache.capacity))
        device = self.device
        self.cache.view = end  # exactly the slots in use: the valid prefix and this pass
        self.cache.length = start
        slots = torch.arange(start, end, device=device)
        if tree is None:
            positions = slots
            if width == 1 and self._unmaskable:
                mask = None  # one row that sees every slot (``_unmaskable``)
            else:
                mask = pass_mask(self.model.config, linear_see(slots[0], width, end), positions, self.dtype)
        else:
            rel, local = tree
            positions = rel + start
            see = torch.cat([local.new_ones(width, start), local], 1)  # every row sees the valid prefix
            slot_pos = torch.cat([torch.arange(start, device=device), positions])
            mask = pass_mask(self.model.config, see, positions, self.dtype, slot_positions=slot_pos)
        self.cache.set_slots(slots)
        ids = torch.tensor([tokens], dtype=torch.long, device=device)  # (1, L)
        kwargs: dict[str, Any] = {
            "past_key_values": self.cache,
            "position_ids": positions[None],
            "use_cache": True,
        }
        kwargs["attention_mask"] = mask
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = rows + pad
        t0 = time.perf_counter()
        out = self.model(input_ids=ids, **kwargs)
        self.model_s += time.perf_counter() - t0
        self.passes += 1
        if pad > 0:
            self.padded += 1
        self.fed.extend(fed)
        self.cache.length = len(self.fed)  # the filler's slots are stale from here on
        self.valid = valid
        return out.logits[0, -(rows + pad) : out.logits.shape[1] - pad]


def device_sync(device: torch.device | str) -> None:
    """Wait for the device's queued work (CUDA kernels run asynchronously): what brackets every timing."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


SKIPPED = -1
"""What ``ModelRunner.fed`` records for a tree entry off the causal line: it never equals a committed token."""

TREE_MEMO = 256
"""Trees (with their pending count) a ``ModelRunner`` keeps built masks for; the memo starts over when full."""


INITIAL_SLOTS = 256
"""Slots a ``ModelRunner``'s cache allocates at its first pass; it doubles (contents kept) whenever a pass needs more."""


def tree_local(pending: int, attend: torch.Tensor) -> torch.Tensor:
    """Which new entry each may see (P+E, P+E) bool in a pass over ``[pending (P), tree entries (E)]``: pending rows
    are causal and see no tree entry; tree rows see every pending token and the tree entries ``attend`` (E, E)
    allows."""
    if pending < 1:
        raise ValueError("a pass feeds at least one pending token (the last committed one)")
    q = pending + int(attend.shape[0])
    # lower-triangular covers pending rows (causal, no tree entry: their columns past the pending block are above
    # the diagonal) and tree rows seeing every pending token
    local = torch.ones(q, q, dtype=torch.bool, device=attend.device).tril_()
    local[pending:, pending:] = attend
    return local


def tree_attention_bias(
    cached: int,
    pending: int,
    attend: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Float additive mask (1, 1, P+E, cached+P+E) of a tree pass (``tree_local``) on top of ``cached`` cache
    entries, which every row sees: 0 where a query (row) may attend a key (column), ``finfo(dtype).min`` elsewhere
    (eager attention adds the mask to the scores: a boolean 4D mask would be wrong there)."""
    local = tree_local(pending, attend).to(device)
    see = torch.cat([local.new_ones(local.shape[0], cached), local], 1)
    return slot_mask(see, dtype)


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
    """Passes, all models together, run wider than their tokens (``pad_widths=auto``, ``prove.decode.padding``)."""
    trace: list[dict[str, Any]] | None = None
    fast: dict[str, int] | None = None
    """Only when the fast path ran (``prove.decode.fast``): its counters for this request — ``cycles``,
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
    host) or the device cycle (``prove.decode.fast.FastEngine``: a method's rule twin, no host sync inside a cycle;
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
    cycles = len(tally.committed_per_cycle)
    stats = Stats(
        new_tokens=len(new),
        cycles=cycles,
        tokens_per_cycle=len(new) / max(cycles, 1),
        model_passes=passes.model,
        verifier_passes=passes.verifier,
        draft_passes=passes.draft,
        accepted_by_depth=tally.accepted_by_depth,
        proposed_by_depth=tally.proposed_by_depth,
        committed_per_cycle=tally.committed_per_cycle,
        wall_s=wall,
        model_s=passes.model_s,
        padded_passes=passes.padded,
        trace=tally.trace if trace else None,
        fast=fast,
    )
    return new, stats
