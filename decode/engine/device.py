"""The device cycle (docs/design.md §3, "The device cycle"): a static slot cache, a fixed-width cycle on the device, one
small record to the host per cycle.

What runs here: ``ar`` and ``sd`` (greedy or sampled), ``prove-lossless`` (unfused and fused), greedy ``prove``,
``pard`` and greedy ``asd``. Their cycle is one function of persistent device buffers (``FastEngine.step``): the
pending token ``last`` and its position ``pos`` (= the valid length of the slot cache: slot = position, always). An
unfused ``prove-lossless`` cycle feeds the block pass ``[last, M×(K−1)]`` at positions pos..pos+K−1, takes its
argmaxes y_1..y_K, feeds the verification pass ``[last, y_1..y_K]`` over the same slots (the placeholders' stale K/V
simply overwritten), runs the rule's sync-free twin (``rules.twins.greedy_match_twin``), moves ``last`` / ``pos`` on
by the committed count and writes the record [count, tokens]. An ``ar`` cycle is the same with K = 0 (the
verification pass alone). A fused cycle (``fused_step``) is one tree pass of K² entries — the carried proposal and,
after every acceptance length, its group of K − 1 placeholders (``prove.decode.engine.fused`` with ``fuse_groups=all``,
without the second candidate) — whose accepted group becomes the next proposal. A greedy ``sd`` cycle
(``draft_step``) is the draft model's k passes on its own slot cache (the first over the last two committed tokens,
so its cache never needs a crop either) and the target's verification pass; greedy ``asd`` is the same cycle with
ASD's twin (``rules.twins.asd_greedy_twin``), its spent regret a device buffer carried across the request's cycles
and the gate's K the proposal the composed cycle drafts (up to the draft's first EOS of the request). A sampled ``ar`` /
``sd`` cycle draws from a buffer of uniforms filled on the device from the Decoder's generator just before the cycle
(``uniforms``: the draft's k draws by inverse CDF, then the rule's k + 1), warps draft and target alike
(``rules.speculative.warp_probs``) and runs speculative sampling's twin (``rules.twins.sd_sample_twin``; ar is
its k = 0 bonus draw), so the step holds no generator and no host read. A ``prove`` cycle (``prove_step``) is the target's
block pass over its pending tokens (the committed y's, whose K/V came from placeholders) and K − 1 placeholders, the
small verifier's pass over [last, y_1..y_K] on its own slot cache, and the θ rule's twin
(``rules.twins.prove_rule_twin``; no correction token). A ``pard`` cycle (``pard_step``) is the same block pass on
the draft model (its pending tokens: everything committed since its last pass, up to K + 1) and the target's greedy
verification, as unfused prove-lossless. The host reads the record (the one sync of a cycle) and applies EOS, stop
strings and ``max_new_tokens`` with the engine's ``Stopper``, in the one loop
(``prove.decode.engine.run``) that runs the composed cycle too; a block that ran past EOS is cut there.

Widths. The regular cycle has fixed widths (K and K + 1; 1 for ar; K² fused; prove 2K − 1 and the verifier's K + 1;
pard the draft's 2K and K + 1). On CUDA it is captured once as a CUDA graph and replayed; elsewhere the same
function runs as is (so every CPU test exercises it). The methods whose committed tokens are a leading run of the
block (greedy ar, prove-lossless fused or not, sd, pard, prove: ``cuts_on_host``) run every cycle at the regular
width, the last ones too: the host cuts what runs past the token budget, which gives the tokens and stats of the
reference's narrowed last cycle (``run`` says why), and the slots written past the budget are scratch
(``slots_needed``). Greedy asd (its gate reads the block's K) and sampled cycles (other draws) narrow a cycle to
the budget as the composed cycle does and run it eagerly on the same slot cache (``Stats.fast['eager_cycles']``).
Prefill is eager. With graphs (``pipeline``), cycle c + 1 is launched before cycle c's record is read wherever it
has the regular width and cycle c may leave budget, so the device never waits for the host's stopping work.

Everything else (mars, nsd, sampled prove, ``draft_threshold``, fuse_groups other than all, a trace or an
``on_cycle`` hook) runs the composed cycle (``prove.decode.engine.loop.ComposedCycle``) in the same loop; which
methods have a device cycle is the registry's (``Method.twin``, ``why_not``). ``fast=auto`` takes this cycle on CUDA.
"""

from __future__ import annotations

import gc
import inspect
import time
from collections.abc import Sequence
from typing import Any

import torch
from prove.decode.engine.cache import (
    SlotCache,
    attention_window,
    bucket,
    unsupported_reason,
)
from prove.decode.engine.cycles import DeviceCycles
from prove.decode.engine.graphs import Compiled
from prove.decode.engine.loop import Passes, Stats, Step, Stopper
from prove.decode.rules.twins import (
    GreedyTwin,
)

DEFAULT_CACHE_LEN = 4096
"""Slots the device cycle allocates first unless ``cache_len`` says otherwise (capped by ``max_position_embeddings``);
a request that needs more grows the cache (``FastEngine.growable``). A pass attends only the slots in use
(``slot_cache.bucket``), so the allocation costs memory, not time."""

COUNTERS = (
    "cycles",
    "graph_replays",
    "eager_cycles",
    "syncs",
    "passes",
    "captures",
    "dropped_cycles",
    "draft_passes",
    "verifier_passes",
    "compiles",
    "grows",
)
"""What ``FastEngine.counters`` counts, each from 0 when the engine is built."""


def why_not(method: Any, params: Any, model: Any, second: Any = None) -> str | None:
    """Why the device cycle cannot run ``method`` with ``params`` on ``model`` (and ``second``, the draft or verifier it
    runs beside it), or None if it can: the method's registry entry names a rule twin (``Method.twin``, and
    ``Method.sampled_twin`` at temperature > 0) and nothing asks for what only the composed cycle does."""
    if method.twin is None:
        return f"method {method.name} has no rule twin (it runs the composed cycle)"
    if params.temperature > 0 and not method.sampled_twin:
        return f"method {method.name} has no sampling twin (temperature=0 runs one)"
    if params.fuse and (params.block_size or 0) < 2:
        return "a fused cycle needs block_size ≥ 2"
    if params.fuse and params.fuse_groups != "all":
        return f"its fused cycle drafts every group (fuse_groups=all), not fuse_groups={params.fuse_groups}"
    if params.draft_threshold:
        return "draft_threshold cuts proposals to varying widths (draft_threshold=0)"
    for m in (model, second):
        if m is not None and "logits_to_keep" not in inspect.signature(m.forward).parameters:
            return f"{type(m).__name__}.forward takes no logits_to_keep (the device cycle keeps the rows it reads)"
        if m is not None and m.get_output_embeddings() is None:
            return f"{type(m).__name__} exposes no output embeddings (get_output_embeddings)"
    K = params.block_size or params.k or 0
    span = K * K + K if params.fuse else 2 * K + 2  # the furthest a pass's entries lie from one of its rows
    for role, m in (("model", model), ("verifier" if method.needs_verifier else "draft", second)):
        reason = None if m is None else unsupported_reason(m.config)
        if reason is not None:
            return f"the {role} cannot use the slot cache: {reason}"
        window = None if m is None else attention_window(m.config)[0]
        if window is not None and window <= span:
            return (
                f"the {role}'s sliding window ({window}) is not wider than a pass's span ({span} positions at "
                f"K = {K}); a smaller block_size"
            )
    return None


class FastEngine(DeviceCycles):
    """The device cycle for one method on the target model: ``ar`` (``block_size`` 0), ``prove-lossless`` (K;
    ``fused``), ``sd`` (``draft``; ``block_size`` = its k), ``prove`` (``verifier``, ``theta``), ``pard`` (``draft``,
    ``block_draft``) or greedy ``asd`` (``draft``, ``asd``); ar and sd sample when ``temperature`` > 0 (with
    ``top_k`` / ``top_p``, drawing from ``generator``).

    ``capacity`` slots are allocated per model; a request needs about prompt + max_new_tokens of them, plus the
    scratch its last cycles write past the budget (``slots_needed``). ``growable``: a request that needs more
    reallocates the caches at the next power of two (else it is refused with the ``cache_len`` that fits). Each pass
    attends the slots in use rounded up to a power of two (``SlotCache.view``), set by the host before each launch. ``graphs`` (default: on CUDA) captures
    the regular cycle as a CUDA graph the first time it runs."""

    def __init__(
        self,
        model: Any,
        *,
        block_size: int,
        mask_token_id: int | None,
        allowed: torch.Tensor | None,
        capacity: int,
        graphs: bool | None = None,
        fused: bool = False,
        draft: Any = None,
        block_draft: bool = False,
        verifier: Any = None,
        theta: float = 0.0,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
        asd: dict[str, Any] | None = None,
        compile: bool = False,
        growable: bool = False,
    ) -> None:
        self.model = model
        self.draft = draft
        """``sd``'s draft model (``block_size`` is then its lookahead k), ``pard``'s block draft, or None."""
        self.block_draft = block_draft
        """The draft proposes K tokens in one block pass (``pard``) rather than k sequential ones (``sd``)."""
        self.verifier = verifier
        """``prove``'s small verifier (its q_i gate the block by p̃_i·q_i ≥ ``theta``), or None."""
        self.theta = theta
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        """Sampling (``ar`` and ``sd`` only; temperature 0 = greedy): the warping of ``rules.speculative.warp_probs``."""
        self.asd = asd
        """Greedy ``asd`` on the draft's proposals: its ``budget``, ``gate`` and ``max_mismatches``, or None."""
        self.generator = generator
        """Where a sampled cycle's uniforms come from (the Decoder's, reseeded by ``generate(seed=...)``)."""
        self.K = block_size
        self.fused = fused
        self.growable = growable
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self._allocate_caches(capacity)
        self._allocate_buffers(allowed, mask_token_id)
        if fused:
            self._tree_constants(block_size)
        self._set_launching(graphs, compile)

    def _allocate_caches(self, capacity: int) -> None:
        """A slot cache of ``capacity`` slots for each model the cycle runs (target, draft, verifier)."""
        self.cache = SlotCache.for_model(self.model, capacity)
        self.capacity = capacity
        if self.draft is not None:
            self.draft_cache = SlotCache.for_model(self.draft, capacity)
        if self.verifier is not None:
            self.verifier_cache = SlotCache.for_model(self.verifier, capacity)

    def _allocate_buffers(self, allowed: torch.Tensor | None, mask_token_id: int | None) -> None:
        """The cycle's state on the device, allocated once per engine: a captured graph reads and writes these very
        tensors, so each request refills them in place."""
        K, device = self.K, self.device
        V = self.model.get_output_embeddings().weight.shape[0]
        penalty = torch.zeros(V, dtype=torch.float32, device=device)
        if allowed is not None:
            penalty.masked_fill_(~allowed.to(device), float("-inf"))
        self.penalty = penalty
        self.mask_fill = torch.full((max(K - 1, 0),), mask_token_id or 0, device=device)
        self.last = torch.zeros(1, dtype=torch.long, device=device)
        self.prev = torch.zeros(1, dtype=torch.long, device=device)  # sd: the committed token before last
        if self.draft is not None:
            Vd = self.draft.get_output_embeddings().weight.shape[0]
            self.draft_pad = torch.full((1, max(V - Vd, 0)), float("-inf"), device=device)
        self.pends = self.verifier is not None or self.block_draft
        """A block pass over pending tokens (``_block_pass``): prove's target (up to K pending), pard's draft (K + 1)."""
        if self.pends:
            self.pend = torch.zeros(K + self.block_draft, dtype=torch.long, device=device)
            self.npend = torch.zeros((), dtype=torch.long, device=device)
        self.is_eos = torch.zeros(V, dtype=torch.bool, device=device)  # the request's EOS ids
        self.spent = torch.zeros((), dtype=torch.float64, device=device)  # asd: the request's regret spent
        self.pos = torch.zeros((), dtype=torch.long, device=device)
        self.record = torch.zeros(K + 2, dtype=torch.long, device=device)
        self.adds_token = int(self.verifier is None)
        """1 if a cycle commits a correction / bonus token after the accepted ones (every method here but prove)."""
        self.uniforms = (
            torch.zeros(2 * K + 1, device=device) if self.temperature > 0 else None
        )  # a sampled cycle's draws: u[:K] the draft's, u[K:] the rule's k + 1

    def _set_launching(self, graphs: bool | None, compile: bool) -> None:
        """How the regular cycle runs (captured, compiled, pipelined, cut by the host) and what is counted."""
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        self._graphs: dict[int, Any] = {}
        """The regular cycle's CUDA graph for each view (bucket) it ran at: captured once, reused across requests."""
        self._graph: Any = None  # the last one replayed (``replay_ms`` times it)
        self._regular: Any = self.step
        self.compiled = compile
        """The regular cycle runs through ``torch.compile`` (inductor): compiled on its first call (the capture's
        warm-up on CUDA), then captured as is. Other widths (eager cycles) and prefill stay eager."""
        if compile:
            self._regular = Compiled(self.step)
        self.rule: GreedyTwin = GreedyTwin()
        """The greedy cycles' rule (ar, prove-lossless, greedy sd, pard): greedy matching, or a benchmark's
        (``set_rule``)."""
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.exact_views = not self.graphs and not compile
        """Nothing is captured or compiled: each pass attends exactly the slots in use (``_view``), a one-row pass
        that sees them all runs unmasked on a CPU (``_unmasked``), and the prompt rides on the first pass of each
        model whose cycle starts with a linear pass (``prefill``). With graphs or ``compile`` views are buckets and the
        prompt has a pass of its own, so that every cycle keeps the one shape its graph was made for."""
        self._prefix: dict[str, torch.Tensor] = {}
        """Per role, the prompt tokens its model's first pass of the request prepends (``prefill``, ``_forward``)."""
        self._prefilled = 0
        """1 if the request's prompt had a target pass of its own (``prefill``): ``Stats.model_passes`` leaves it out."""
        self.pipeline = self.graphs
        """Launch cycle c + 1 before reading cycle c's record where the budget allows (default: with graphs)."""
        self.cuts_on_host = self.fused or (self.temperature == 0 and self.asd is None)
        """Every cycle runs at the regular width and the host cuts what runs past the token budget (``run``): the
        methods whose committed tokens are a leading run of the block's (fused and unfused prove-lossless, greedy
        sd, pard, prove; ar has one width). asd (its gate reads the block's K) and sampled cycles (other draws)
        narrow their last cycles to the budget instead, and run those eagerly."""
        self.cycle_s = 0.0
        """Host seconds from launching a cycle to holding its record (the device's work included)."""
        self.compile_s = 0.0
        """Seconds spent in the calls of the regular cycle that compiled it (``compile``)."""

    # -- the cycles by kind live in ``cycles.DeviceCycles``; capture, launch and read here ------------------------

    def set_rule(self, rule: GreedyTwin | None) -> None:
        """The greedy cycles' rule object from now on (None: greedy matching, ``GreedyTwin``): a benchmark passes
        ``rules.twins.InjectedAcceptance`` (random weights accept nothing). The captured graphs are rebuilt."""
        self.rule = GreedyTwin() if rule is None else rule
        self._graphs.clear()
        self._graph = None

    def wrap_step(self, wrapper: Any) -> None:
        """Run the regular-width cycle through ``wrapper(self.step)`` (the tests: ``torch.compile`` with
        ``fullgraph=True``, which fails on a host sync or a graph break, and recompiles made fatal)."""
        self._regular = wrapper(self.step)
        self.exact_views = False  # a wrapped (compiled) cycle keeps the bucketed shapes

    def _caches(self) -> list[SlotCache]:
        return [self.cache] + [
            getattr(self, n) for n in ("draft_cache", "verifier_cache") if hasattr(self, n)
        ]

    def _view(self, used: int) -> None:
        """Let the next passes attend slots 0..bucket(used)−1 of every cache (``used``: one past the highest slot
        they read or write); an engine that neither captures nor compiles (``exact_views``) attends exactly the
        slots 0..used−1 (a bucket exists to bound how many graphs and compiles there are)."""
        for cache in self._caches():
            used_here = min(used, cache.capacity)
            cache.view = used_here if self.exact_views else bucket(used_here, cache.capacity)
            cache.compileable = (
                not self.exact_views
            )  # transformers may skip an unmasked row's mask (``_unmasked``)

    def _launch(self, k: int, used: int) -> tuple[torch.Tensor, Any, int]:
        """Start one cycle that reads and writes slots below ``used`` (replaying the captured graph of the regular
        width at its view) and queue its record's copy to the host; returns (host record, CUDA event or None, k).
        Nothing waits for the device here."""
        self._view(used)
        if (
            self.uniforms is not None
        ):  # a sampled cycle's draws, made on the device before the cycle reads them
            self.uniforms.uniform_(generator=self.generator)
        if k == self.K and self.graphs:
            view = self.cache.view
            if view not in self._graphs:
                self._graphs[view] = self._capture()
            self._graph = self._graphs[view]
            self._graph.replay()
            self.counters["graph_replays"] += 1
            record = self.record
        elif k == self.K:
            record = self._call_regular(k)
        else:
            record = self.step(k)
            self.counters["eager_cycles"] += 1
        if self.device.type != "cuda":
            return record.clone(), None, k
        host = torch.empty(record.shape, dtype=record.dtype, pin_memory=True)
        host.copy_(record, non_blocking=True)  # stream-ordered before a later replay rewrites ``record``
        event = torch.cuda.Event()
        event.record()
        return host, event, k

    def _call_regular(self, k: int) -> torch.Tensor:
        """The regular cycle (compiled or not), the graphs' dynamo compiles it set off counted in ``compiles``."""
        if not self.compiled:
            return self._regular(k)
        record, compiled = self._regular(k)
        self.counters["compiles"] += compiled
        if compiled:
            self.compile_s += self._regular.last_s
        return record

    def _read(self, launched: tuple[torch.Tensor, Any, int], k: int) -> list[int]:
        """Wait for a launched cycle's record (the cycle's one sync) and return its committed tokens. The pass
        counters count the cycle as the composed cycle runs it, with a block of ``k`` (the budget's block, where a
        regular-width cycle ran in its place: ``run``)."""
        host, event, _ = launched
        if event is not None:
            event.synchronize()
        self.counters["passes"] += 1 + (
            k > 0 and not self.fused and self.draft is None and self.verifier is None
        )
        self.counters["draft_passes"] += (k > 0 if self.block_draft else k) if self.draft is not None else 0
        self.counters["verifier_passes"] += self.verifier is not None
        self.counters["syncs"] += 1
        self.counters["cycles"] += 1
        out = host.tolist()
        return out[1 : 1 + out[0]]

    def _capture(self) -> Any:
        """The regular cycle as a CUDA graph over the persistent buffers (warmed up on a side stream first). Its
        replay advances ``last`` / ``pos`` and fills ``record``; capture leaves the state as it found it."""
        saved = self._state()
        # An unreachable object holding an older graph (an earlier Decoder's) must not be collected during the
        # capture: freeing a graph there invalidates the capture (cudaErrorStreamCaptureInvalidated).
        gc.collect()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # the first call compiles the cycle under compile=true
                self.record.copy_(self._call_regular(self.K))
                self._restore(saved)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.record.copy_(self._call_regular(self.K))
        self._restore(saved)
        self.counters["captures"] += 1
        return graph

    def _state(self) -> list[torch.Tensor]:
        """Copies of every buffer a cycle advances (what capture and timing replays put back)."""
        return [b.clone() for b in self._buffers()]

    def _buffers(self) -> list[torch.Tensor]:
        extra = [self.carried, self.have] if self.fused else [self.prev] if self.draft is not None else []
        extra += [self.pend, self.npend] if self.pends else []
        extra += [self.spent] if self.asd is not None else []
        return [self.last, self.pos, *self.rule.buffers(), *extra]

    def _restore(self, saved: list[torch.Tensor]) -> None:
        for b, v in zip(self._buffers(), saved, strict=True):
            b.copy_(v)

    def _widest(self) -> int:
        """Slots a pass may write past the pending token's: the fused tree's width, else a verify pass's K + 1."""
        return self.width if self.fused else self.pend.shape[0] + self.K - 1 if self.pends else self.K + 1

    def replay_ms(self, repeats: int = 20) -> float | None:
        """GPU milliseconds of one regular cycle: back-to-back replays of the captured graph timed with CUDA events
        (launches queue ahead, so this is the device's time, not the host's). None without a captured graph (off
        CUDA, or before a request). The replays start at position 0 (a pass attends every slot, so its cost does
        not depend on where it sits) and overwrite the cache: what they leave is stale, and the next request's
        prefill and passes write every slot before a row may read it; the pending token and position are restored."""
        if self._graph is None:
            return None
        repeats = min(repeats, (self.cache.view - self._widest()) // (self.K + 1))
        saved = self._state()
        self.pos.zero_()
        torch.cuda.synchronize(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            self._graph.replay()
        end.record()
        end.synchronize()
        self._restore(saved)
        return float(start.elapsed_time(end)) / repeats

    # -- a request ----------------------------------------------------------------------------------------------

    def serves(self, prompt_len: int) -> bool:
        """Whether this request runs here: ``sd`` needs two prompt tokens (its draft re-feeds the last two)."""
        return self.draft is None or self.block_draft or prompt_len >= 2

    def _reach(self) -> tuple[int, int]:
        """How many slots past a cycle's pending slot ``pos`` the cycle writes at most, for a full-width cycle
        (``cuts_on_host``): (launched with ``pos`` known; launched ahead of the cycle at ``pos``, which commits c ≤
        K + 1 tokens on the device — K for prove and fused — so the ahead cycle's pending slot is pos + c). A verify
        pass writes [last, y_1..y_K] at pos..pos+K. The fused tree writes K² entries from pos. A block pass over
        npend ≥ 1 pending tokens (padded to its P: prove K, pard K + 1) and K − 1 placeholders writes from
        pos − npend + 1 up to pos − npend + P + K − 1, and a cycle ahead has npend = c: its block pass ends where
        the first cycle's would with npend = 0."""
        K = self.K
        if self.fused:
            return K * K - 1, K + K * K - 1
        if self.block_draft:  # pard: the draft's block pass (P = K + 1), then the target's verify pass
            return max(2 * K - 1, K), max(2 * K, K + 1 + K)
        if self.verifier is not None:  # prove: the target's block pass (P = K), the verifier's K + 1 pass
            return max(2 * K - 2, K), max(2 * K - 1, K + K)
        # ar (K = 0), unfused prove-lossless, sd: the verify pass (sd's draft passes stay below it)
        return K, K + 1 + K

    def slots_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        """KV slots a request writes at most (exactly: some request of these lengths writes the last one).

        A cycle runs only while a token of the budget is left, so its pending token sits at most at position
        prompt + max_new_tokens − 2. A cycle narrowed to the budget (asd, sampled) writes no further than the last
        new token's position less one; a full-width one (``cuts_on_host``) writes ``_reach`` past its pending
        slot, which is scratch where it runs past the budget. With ``pipeline`` a cycle is launched ahead only
        while the one before it leaves a token of budget uncommitted (pending at most at prompt + max_new_tokens
        − 3), and that one may commit its whole block on the device past the budget before the host cuts it."""
        last = prompt_len + max_new_tokens - 2  # the furthest pending slot
        if not self.cuts_on_host:
            return last + 1
        fresh, ahead = self._reach()
        furthest = last + fresh
        if self.pipeline and max_new_tokens >= 2:
            furthest = max(furthest, last - 1 + ahead)
        return furthest + 1

    def fits(self, prompt_len: int, max_new_tokens: int) -> bool:
        """Whether this request runs here: its slots fit the caches, or they may grow."""
        return self.growable or self.slots_needed(prompt_len, max_new_tokens) <= self.capacity

    def check_room(self, prompt_len: int, max_new_tokens: int) -> None:
        """Make room for a request: grow the caches to the power of two that holds it (``growable``), else refuse a
        request that does not fit with the ``cache_len`` that would."""
        need = self.slots_needed(prompt_len, max_new_tokens)
        if need > self.capacity and self.growable:
            self.capacity = max(need, 1 << (need - 1).bit_length())
            for cache in self._caches():
                cache.resize(self.capacity)
            self._graphs.clear()  # new buffer addresses: captured graphs read the old ones
            self._graph = None
            self.counters["grows"] += 1
        if need > self.capacity:
            raise ValueError(
                f"the prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) need {need} KV slots but "
                f"the device cycle allocated {self.capacity}: build the Decoder with cache_len={need} or more, or pass "
                "fast=false"
            )

    def prefill(self, prompt: Sequence[int]) -> None:
        """The prompt less its last token into slots 0..P−2 of each model (sd's draft: less its last two, which its
        first pass re-feeds); the last token becomes the pending one. Where views are exact and the model's cycle
        starts with a linear pass (``_forward``: the target's verify or AR pass, sd's draft, prove's verifier) the
        prompt is queued instead and that pass prepends it, as the composed cycle's first pass feeds the whole
        prompt: one pass a request fewer. A block pass (prove's target, pard's draft) or a tree pass (fused) gets a
        pass of its own."""
        P = len(prompt)
        self._view(P)
        self._prefix.clear()
        linear_first = {
            "model": not self.fused and self.verifier is None,
            "draft": not self.block_draft,
            "verifier": True,
        }
        skip = {"draft": 2 if self.draft is not None and not self.block_draft else 1}
        roles = ["model"] + ["draft"] * (self.draft is not None) + ["verifier"] * (self.verifier is not None)
        self._prefilled = 0
        for role in roles:
            keep = P - skip.get(role, 1)
            if keep < 1:
                continue
            ids = torch.tensor(prompt[:keep], dtype=torch.long, device=self.device)
            if self.exact_views and linear_first[role]:
                self._prefix[role] = ids
                continue
            self._forward(ids, torch.zeros((), dtype=torch.long, device=self.device), 1, role=role)
            if role == "model":
                self._prefilled = 1
                self.counters["passes"] += 1
        if self.draft is not None and not self.block_draft:
            self.prev.fill_(int(prompt[-2]))
        if self.pends:
            self.pend[0] = int(prompt[-1])
            self.npend.fill_(1)
        self.last.fill_(int(prompt[-1]))
        self.pos.fill_(P - 1)
        if self.fused:
            self.have.zero_()

    def run(self, prompt_ids: Sequence[int], stopper: Stopper) -> tuple[list[int], Stats]:
        """Decode one request on this cycle through the engine's one loop (``prove.decode.engine.run``)."""
        from prove.decode.engine import run

        return run(prompt_ids, cycle=self, stopper=stopper)

    # -- the engine's cycle interface (``prove.decode.engine.Cycle``) ----------------------------------------------

    def torch_models(self) -> list[Any]:
        return [m for m in (self.model, self.draft, self.verifier) if m is not None]

    def begin(self, prompt: list[int], stopper: Stopper) -> None:
        """A request starts: room in the caches, the prompt prefilled (``prefill``), the per-request buffers reset."""
        self._start = dict(self.counters), self.cycle_s
        self._prompt_len = len(prompt)
        self.check_room(len(prompt), stopper.max_new_tokens)
        self.rule.reset()  # a rule twin's per-request state (a benchmark's injected acceptance) starts over
        self.prefill(prompt)
        self.spent.zero_()  # asd's budget is per request
        self.is_eos.zero_()
        eos = [t for t in stopper.eos if 0 <= t < self.is_eos.shape[0]]
        if eos:
            self.is_eos[torch.tensor(eos, device=self.device)] = True
        self._ahead: tuple[torch.Tensor, Any, int] | None = (
            None  # a regular cycle launched before the last was read
        )
        self._cycles = 0

    def advance(self, seq: list[int], left: int) -> Step:
        """One cycle of the request (``engine.run``'s loop calls it with the tokens ``left`` to the budget): launch it (or
        take the one launched ahead), launch the next where the budget allows (``pipeline``), read its record.

        The last cycles. The composed cycle narrows a cycle's block to what the token budget allows, k = min(K,
        left − 1) (prove: min(K, left), no correction token). A full-width method (``cuts_on_host``) runs the regular
        cycle of K instead, and the host's ``Stopper`` cuts its record at the budget; the tokens are the same. The
        block pass and the verify pass are causal: the rows y_1..y_k of a k-wide block equal the first k of the
        K-wide one (a placeholder row sees the placeholders before it only), and so do the verifier's rows over
        [last, y_1..y_k] (greedy g_1..g_{k+1}; prove's q_1..q_k), while every rule here commits a leading run of
        per-position tests: greedy matching commits y_1..y_n and g_{n+1}, prove y_1..y_n (n ≥ 1). So the narrow
        cycle's n is min(n_K, k) and its tokens are the first min(n_K, k) + 1 (prove: min(n_K, k)) of the full
        cycle's. Where n_K < k both commit the same tokens and the request goes on from the same state; where
        n_K ≥ k the narrow cycle commits k + 1 = left tokens (prove: k = left), the full one at least as many with
        those first, and the cut at the budget keeps exactly those. The stats count the cycle as the composed cycle
        runs it: k proposed, min(n_K, k) accepted (capped by what was committed), the passes of a block of k (none
        of the block pass at k = 0). In floating point the usual caveat holds: passes of other widths may take
        other kernels (fp32 is the exactness reference). A fused cycle keeps its tree the same way."""
        # the block a composed cycle would propose: what the budget allows, less the correction / bonus
        k = min(self.K, left - self.adds_token)
        # a full-width method runs the regular cycle whatever the budget, and the host cuts (see above)
        width = self.K if self.cuts_on_host else k
        c0 = time.perf_counter()
        pos = len(seq) - 1  # the pending token's slot, known here
        fresh, far = self._reach()
        launched = self._ahead if self._ahead is not None else self._launch(width, pos + fresh + 1)
        assert launched[2] == width, "a cycle launched ahead has another width than its turn's"
        # launch the next cycle before reading this one's record where its width is surely the regular one (a
        # full-width method's always; else where the budget leaves K whatever this one commits, ≤ K + 1 tokens) and
        # this one may leave a token of budget: the device never waits for the host's EOS, stop string and budget
        # work. If this cycle ends the request, the next one's work is dropped (``end``).
        self._ahead = None
        if self.pipeline and width == self.K and (left >= 2 if self.cuts_on_host else left >= 2 * self.K + 2):
            self._ahead = self._launch(self.K, pos + far + 1)
        tokens = self._read(launched, k)
        self.cycle_s += time.perf_counter() - c0
        proposed = (self.K - 1) * (self._cycles > 0) if self.fused else k
        self._cycles += 1
        return Step(proposed, min(len(tokens) - self.adds_token, proposed), tokens)

    def sync(self, seq: list[int]) -> None:
        self.cache.length = len(seq) - 1  # the committed tokens before the pending one are valid

    def end(self) -> tuple[Passes, dict[str, int]]:
        if self._ahead is not None:  # launched for a request that ended: wait for it, count it apart
            if self._ahead[1] is not None:
                self._ahead[1].synchronize()
            self.counters["dropped_cycles"] += 1
            self._ahead = None
        start, start_s = self._start
        fast = {key: self.counters[key] - start[key] for key in self.counters}
        fast["graphs"] = int(self.graphs)
        fast["compiled"] = int(self.compiled)
        passes = Passes(
            model=fast["passes"] - self._prefilled,
            verifier=fast["verifier_passes"],
            draft=fast["draft_passes"],
            model_s=self.cycle_s - start_s,
        )
        return passes, fast
