"""A model on its slot cache (docs/design.md §3, "KV caches"): ``ModelRunner``, the passes the composed cycle's
proposers and verifiers ask for, and the bookkeeping that keeps each cache exactly the committed prefix's K/V.

Entry i of a runner's cache sits at slot i (``prove.decode.engine.cache.SlotCache``) and ``fed[i]`` records the
token fed there. An entry is valid iff every token fed up to it equals the committed sequence there (causal
attention: the entry depends on nothing later). After every cycle the loop syncs each runner to its valid prefix (a
length: the stale slots past it are overwritten by the next pass and never read, since a pass attends exactly the
slots below its own end); entries computed from placeholders (``<|mask|>``) or from rejected tokens are dropped, and
committed tokens without valid K/V are "pending": fed at the front of the runner's next pass.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from typing import Any

import torch
from prove.decode.engine.cache import SlotCache, attention_window, linear_see, pass_mask, slot_mask
from prove.decode.engine.memo import IdentityMemo


class ModelRunner:
    """A causal LM, its slot cache (``prove.decode.engine.cache.SlotCache``) and the tokens its entries were computed
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
        """Widths at which a linear pass runs wider, {w: w'} (``prove.decode.engine.padding``; empty = never)."""
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
        """A linear pass of a model without a sliding window runs with no mask of ours: its view is exactly the valid
        prefix (at slot = position) and its own rows, the cache reports the prefix as its length and the view as its
        mask size, so the causal mask transformers builds from them (or none: a one-row pass, sdpa's cheaper kernel)
        is exactly the one the pass needs — what it built over a ``DynamicCache``. A sliding model's window is ours
        (``pass_mask`` in position space)."""

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
        verify-and-draft pass, ``prove.decode.engine.fused``): entry e sits at position ``len(seq) + offsets[e]``
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
            if self._unmaskable:
                mask = None  # causal over exactly the slots in use: transformers' own mask (``_unmaskable``)
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
