"""The fast path (docs/design.md §3.0): a static slot cache, a fixed-width cycle on the device, one small record
to the host per cycle.

What runs here: ``ar`` and ``prove-lossless`` (unfused), greedy. Their cycle is one function of persistent
device buffers (``FastEngine.step``): the pending token ``last`` and its position ``pos`` (= the valid length of
the slot cache: slot = position, always). A ``prove-lossless`` cycle feeds the block pass ``[last, M×(K−1)]`` at
positions pos..pos+K−1, takes its argmaxes y_1..y_K, feeds the verification pass ``[last, y_1..y_K]`` over the
same slots (the placeholders' stale K/V simply overwritten), runs the rule's sync-free twin
(``rules.twins.greedy_match_twin``), moves ``last`` / ``pos`` on by the committed count and writes the record
[count, tokens]. An ``ar`` cycle is the same with K = 0 (the verification pass alone). The host reads the record
(the one sync of a cycle) and applies EOS, stop strings and ``max_new_tokens`` with the engine's ``Stopper``, exactly
as the reference loop (``prove.decode.engine.run``) does; a block that ran past EOS is cut there.

Widths. The regular cycle has fixed widths (K and K + 1; 1 for ar). On CUDA it is captured once as a CUDA graph and
replayed; elsewhere the same function runs as is (so every CPU test exercises it). A cycle of any other width
(the last cycles, when the token budget is below K) runs the same function eagerly on the same slot cache, and the
stats count it (``Stats.fast['eager_cycles']``). Prefill is eager.

Everything else (sampling, mars, prove, the SD family, fused cycles, ``draft_threshold``, a trace or an
``on_cycle`` hook) takes the reference path; ``fast=auto`` chooses this path on CUDA for a model the slot cache
serves (``slot_cache.unsupported_reason``) after a self-check against ``DynamicCache`` (``self_check``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from prove.decode.engine import Stats, Stopper, _Tally
from prove.decode.rules.twins import commit_record, greedy_match_twin
from prove.decode.slot_cache import SlotCache, linear_mask, unsupported_reason
from transformers import DynamicCache

FAST_METHODS = ("ar", "prove-lossless")
"""The methods the fast path runs (greedy, unfused, without draft_threshold); the rest take the reference path."""

DEFAULT_CACHE_LEN = 4096
"""Slots the fast path allocates unless ``cache_len`` says otherwise (capped by ``max_position_embeddings``)."""


def why_not(method: Any, params: Any, model: Any) -> str | None:
    """Why the fast path cannot run ``method`` with ``params`` on ``model``, or None if it can."""
    if method.name not in FAST_METHODS:
        return f"method {method.name} is not on it (it runs {', '.join(FAST_METHODS)})"
    if params.temperature > 0:
        return "it is greedy only (temperature=0)"
    if params.fuse:
        return "fused cycles are not on it yet (fuse=false)"
    if params.draft_threshold:
        return "draft_threshold cuts proposals to varying widths (draft_threshold=0)"
    reason = unsupported_reason(model.config)
    return None if reason is None else f"the model cannot use the slot cache: {reason}"


class FastEngine:
    """The fast path for one model (the target) and one method (``ar``: ``block_size`` 0, or ``prove-lossless``).

    ``capacity`` slots are allocated once; a request needs prompt + max_new_tokens of them. ``graphs`` (default: on
    CUDA) captures the regular cycle as a CUDA graph the first time it runs."""

    def __init__(
        self,
        model: Any,
        *,
        block_size: int,
        mask_token_id: int | None,
        allowed: torch.Tensor | None,
        capacity: int,
        graphs: bool | None = None,
    ) -> None:
        self.model = model
        self.K = block_size
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.cache = SlotCache.for_model(model, capacity)
        self.capacity = capacity
        V = model.get_output_embeddings().weight.shape[0]
        penalty = torch.zeros(V, dtype=torch.float32, device=self.device)
        if allowed is not None:
            penalty.masked_fill_(~allowed.to(self.device), float("-inf"))
        self.penalty = penalty
        self.mask_fill = torch.full((max(block_size - 1, 0),), mask_token_id or 0, device=self.device)
        self.last = torch.zeros(1, dtype=torch.long, device=self.device)
        self.pos = torch.zeros((), dtype=torch.long, device=self.device)
        self.record = torch.zeros(block_size + 2, dtype=torch.long, device=self.device)
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        self._graph: Any = None
        self._regular: Any = self.step
        self._inject: torch.Tensor | None = None
        self._inject_at = torch.zeros((), dtype=torch.long, device=self.device)
        self.counters = {
            "cycles": 0,
            "graph_replays": 0,
            "eager_cycles": 0,
            "syncs": 0,
            "passes": 0,
            "captures": 0,
        }
        self.cycle_s = 0.0
        """Host seconds from launching a cycle to holding its record (the device's work included)."""

    # -- the device cycle ---------------------------------------------------------------------------------------

    def _forward(self, ids: torch.Tensor, start: torch.Tensor, rows: int) -> torch.Tensor:
        """The model over ``ids`` (W,) at positions = slots start..start+W−1 on the slot cache; logits of the last
        ``rows`` (rows, V), restricted to the allowed ids, in float32."""
        w = ids.shape[0]
        positions = start + torch.arange(w, device=self.device)  # (W,)
        self.cache.set_slots(positions)
        out = self.model(
            input_ids=ids[None],
            position_ids=positions[None],
            past_key_values=self.cache,
            attention_mask=linear_mask(start, w, self.capacity, self.dtype),
            use_cache=True,
            logits_to_keep=rows,
        )
        return out.logits[0, -rows:].float() + self.penalty  # (rows, V)

    def step(self, k: int) -> torch.Tensor:
        """One cycle with a block of ``k`` (0 = AR): reads and advances ``last`` / ``pos`` in place and returns the
        record (k + 2,): [committed count, tokens...]. No host sync, no shape that depends on a value."""
        if k > 0:
            # 1) propose: the block pass [last, M×(k−1)]; y_i = argmax of the softmax (ties: first index, as the
            # reference BlockProposer)
            block = torch.cat([self.last, self.mask_fill[: k - 1]])  # (k,)
            y = torch.softmax(self._forward(block, self.pos, k), -1).argmax(-1)  # (k,)
        else:
            y = self.last[:0]
        # 2) verify: [last, y_1..y_k] over the same slots (the placeholders' K/V overwritten)
        greedy = self._forward(torch.cat([self.last, y]), self.pos, k + 1).argmax(-1)  # (k+1,)
        # 3) accept: the rule's sync-free twin; 4) commit on the device: the new pending token and its position
        n, extra = greedy_match_twin(y, greedy)
        if self._inject is not None:  # a benchmark's preset acceptance, after the rule's full computation
            n = self._inject[self._inject_at].clamp(max=k)  # a scalar bound: no host-to-device copy
            extra = greedy.gather(0, n.view(1)).view(())
            self._inject_at.add_(1).remainder_(self._inject.shape[0])
        self.last.copy_(extra.view(1))
        self.pos.add_(n + 1)
        return commit_record(y, n, extra)

    def inject(self, accepted: Sequence[int] | None) -> None:
        """Benchmarks only (random weights accept nothing): from now on cycle c accepts ``accepted[c % len]`` proposed
        tokens (at most its block; c counts from each request's first cycle), read from a preloaded device buffer after the rule has run, so a cycle costs what
        a real one with that acceptance costs; the committed tokens are then not the model's greedy ones. ``None``
        turns it off. The captured graph is rebuilt."""
        self._inject = None if accepted is None else torch.tensor(list(accepted), device=self.device)
        self._inject_at.zero_()
        self._graph = None

    def wrap_step(self, wrapper: Any) -> None:
        """Run the regular-width cycle through ``wrapper(self.step)`` (the tests: ``torch.compile`` with
        ``fullgraph=True``, which fails on a host sync or a graph break, and recompiles made fatal)."""
        self._regular = wrapper(self.step)

    def _cycle(self, k: int) -> list[int]:
        """Run one cycle (replaying the captured graph for the regular width) and read its record: one sync."""
        t0 = time.perf_counter()
        if k == self.K and self.graphs:
            if self._graph is None:
                self._graph = self._capture()
            self._graph.replay()
            self.counters["graph_replays"] += 1
            record = self.record
        elif k == self.K:
            record = self._regular(k)
        else:
            record = self.step(k)
            self.counters["eager_cycles"] += 1
        self.counters["passes"] += 1 + (k > 0)
        self.counters["syncs"] += 1
        self.counters["cycles"] += 1
        out = record.tolist()
        self.cycle_s += time.perf_counter() - t0
        return out[1 : 1 + out[0]]

    def _capture(self) -> Any:
        """The regular cycle as a CUDA graph over the persistent buffers (warmed up on a side stream first). Its
        replay advances ``last`` / ``pos`` and fills ``record``; capture leaves the state as it found it."""
        saved = (self.last.clone(), self.pos.clone())
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.record.copy_(self.step(self.K))
                self.last.copy_(saved[0])
                self.pos.copy_(saved[1])
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.record.copy_(self.step(self.K))
        self.last.copy_(saved[0])
        self.pos.copy_(saved[1])
        self.counters["captures"] += 1
        return graph

    def replay_ms(self, repeats: int = 20) -> float | None:
        """GPU milliseconds of one regular cycle: back-to-back replays of the captured graph timed with CUDA events
        (launches queue ahead, so this is the device's time, not the host's). None without a captured graph (off
        CUDA, or before a request). The replays start at position 0 (a pass attends every slot, so its cost does
        not depend on where it sits) and overwrite the cache: what they leave is stale, and the next request's
        prefill and passes write every slot before a row may read it; the pending token and position are restored."""
        if self._graph is None:
            return None
        repeats = min(repeats, self.capacity // (self.K + 1))
        saved = (self.last.clone(), self.pos.clone(), self._inject_at.clone())
        self.pos.zero_()
        torch.cuda.synchronize(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            self._graph.replay()
        end.record()
        end.synchronize()
        self.last.copy_(saved[0])
        self.pos.copy_(saved[1])
        self._inject_at.copy_(saved[2])
        return float(start.elapsed_time(end)) / repeats

    # -- a request ----------------------------------------------------------------------------------------------

    def check_room(self, prompt_len: int, max_new_tokens: int) -> None:
        if prompt_len + max_new_tokens > self.capacity:
            raise ValueError(
                f"the prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) need "
                f"{prompt_len + max_new_tokens} KV slots but the fast path allocated {self.capacity}: build the "
                f"Decoder with cache_len={prompt_len + max_new_tokens} or more, or pass fast=false"
            )

    def prefill(self, prompt: Sequence[int]) -> None:
        """Eager: the prompt less its last token into slots 0..P−2; the last token becomes the pending one."""
        P = len(prompt)
        if P > 1:
            ids = torch.tensor(prompt[:-1], dtype=torch.long, device=self.device)
            self._forward(ids, torch.zeros((), dtype=torch.long, device=self.device), 1)
            self.counters["passes"] += 1
        self.last.fill_(int(prompt[-1]))
        self.pos.fill_(P - 1)

    @torch.no_grad()
    def run(self, prompt_ids: Sequence[int], stopper: Stopper) -> tuple[list[int], Stats]:
        """Decode one request; the new tokens and its stats (``Stats.fast`` holds the path's counters)."""
        if len(prompt_ids) == 0:
            raise ValueError("the prompt is empty: give at least one token")
        self.check_room(len(prompt_ids), stopper.max_new_tokens)
        start, start_s = dict(self.counters), self.cycle_s
        self._inject_at.zero_()  # an injected acceptance starts over with every request
        t0 = time.perf_counter()
        self.prefill(prompt_ids)
        new: list[int] = []
        tally = _Tally()
        done = False
        while not done:
            # the block a reference cycle would propose: what the budget allows, less the correction / bonus
            k = min(self.K, stopper.max_new_tokens - len(new) - 1)
            tokens = self._cycle(k)
            before = len(new)
            done = stopper.commit(new, tokens)
            committed = len(new) - before
            self.cache.length = len(prompt_ids) - 1 + len(new)
            tally.committed_per_cycle.append(committed)
            tally.count(k, min(len(tokens) - 1, committed))
        wall = time.perf_counter() - t0
        fast = {key: self.counters[key] - start[key] for key in self.counters}
        fast["graphs"] = int(self.graphs)
        cycles = len(tally.committed_per_cycle)
        stats = Stats(
            new_tokens=len(new),
            cycles=cycles,
            tokens_per_cycle=len(new) / max(cycles, 1),
            model_passes=fast["passes"] - (len(prompt_ids) > 1),
            verifier_passes=0,
            draft_passes=0,
            accepted_by_depth=tally.accepted_by_depth,
            proposed_by_depth=tally.proposed_by_depth,
            committed_per_cycle=tally.committed_per_cycle,
            wall_s=wall,
            model_s=self.cycle_s - start_s,
            fast=fast,
        )
        return new, stats


def self_check(model: Any, *, tokens: int = 6, atol: float | None = None) -> str | None:
    """The slot cache against ``DynamicCache`` on a short pass of this model (a prefill, then a pass after a
    rejected one): None if their logits agree, else a one-line reason. transformers may change its cache
    interface between the 5.x releases this project allows; this catches it when a Decoder is built."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    V = model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (2 * tokens,), generator=g).to(device)
    tol = atol if atol is not None else (1e-3 if dtype == torch.float32 else 5e-2)
    try:
        with torch.no_grad():
            dyn = DynamicCache(config=model.config)
            ref_a = model(input_ids=ids[None, :tokens], past_key_values=dyn, use_cache=True).logits[0]
            ref_b = model(
                input_ids=ids[None, tokens:],
                position_ids=torch.arange(tokens, 2 * tokens, device=device)[None],
                past_key_values=dyn,
                use_cache=True,
            ).logits[0]
            cache = SlotCache.for_model(model, 4 * tokens)

            def run(chunk: torch.Tensor, start: int) -> torch.Tensor:
                pos = torch.arange(start, start + chunk.shape[0], device=device)
                cache.set_slots(pos)
                mask = linear_mask(torch.tensor(start, device=device), chunk.shape[0], cache.capacity, dtype)
                return model(
                    input_ids=chunk[None],
                    position_ids=pos[None],
                    past_key_values=cache,
                    attention_mask=mask,
                    use_cache=True,
                ).logits[0]

            got_a = run(ids[:tokens], 0)
            run(ids.flip(0)[:tokens], tokens)  # a pass that gets rejected: stale slots past the valid length
            got_b = run(ids[tokens:], tokens)
    except Exception as err:  # noqa: BLE001 - any failure means: use the reference path
        return f"the slot cache failed on this model ({type(err).__name__}: {err})"
    scale = max(float(ref_a.abs().max()), 1.0)
    diff = max(float((got_a - ref_a).abs().max()), float((got_b - ref_b).abs().max())) / scale
    if not diff <= tol:
        return f"the slot cache's logits differ from DynamicCache's by {diff:.2e} (relative) on this model"
    return None
