"""The device cycle's cycles by kind (docs/design.md §3, "The device cycle"): one function of persistent device buffers
per kind — unfused self-verified (ar, prove-lossless: ``step``), fused (``fused_step``), a draft model's (sd, asd:
``draft_step``), a block draft's (pard: ``pard_step``), a small verifier's (prove: ``prove_step``) — each ending in
its rule's sync-free twin. ``FastEngine`` (``prove.decode.engine.device``) holds the buffers, launches, captures and
reads them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from prove.decode.engine.cache import GROUPED_SDPA, SlotCache, attention_window, linear_see, pass_mask
from prove.decode.engine.tree import tree_layout
from prove.decode.rules.block import leading_true
from prove.decode.rules.speculative import sample_from_probs, warp_probs
from prove.decode.rules.twins import asd_greedy_twin, commit_record, prove_rule_twin, sd_sample_twin

if TYPE_CHECKING:
    from prove.decode.engine.device import FastEngine


class DeviceCycles:
    """The cycle functions of ``FastEngine`` (a mixin: every method's ``self`` is the engine)."""

    def _tree_constants(self: FastEngine, K: int) -> None:
        """The fused tree of block size K with every group (``fuse_groups=all``, no second candidate): entries
        [c, y_1..y_{K−1}, G_0, …, G_{K−1}], each G_j of K − 1 placeholders, W = K² in all, written at slots
        pos..pos+W−1 in that order, so the chain c, y_1.. sits at slot = position and the groups in scratch slots
        past it (never kept: the accepted y's are contiguous after the context, as in ``prove.decode.engine.fused``).
        Positions: y_i at pos + i; G_j's placeholder r at pos + 1 + j + r. G_j's row r sees c, y_1..y_j and G_j's
        rows 0..r: the block pass from y_j."""
        k = K - 1
        layout = tree_layout(k, [(j, k) for j in range(k + 1)])
        attend = layout.attend  # (E, E) over [y, groups]
        E = layout.width
        W = E + 1
        local = torch.zeros(W, W + 1, dtype=torch.bool)  # a last column of False: "not in the pass"
        local[:, 0] = True  # every entry sees c
        local[1:, 1:W] = attend
        self.tree_local = local.to(self.device)
        self.tree_pos = torch.cat([torch.zeros(1, dtype=torch.long), layout.offsets + 1]).to(
            self.device
        )  # (W,)
        self.group_rows = torch.tensor(
            [1 + start for _, start, _ in layout.groups], device=self.device
        )  # (K,)
        self.carried = torch.zeros(k, dtype=torch.long, device=self.device)  # the proposal y_1..y_{K−1}
        self.have = torch.zeros((), dtype=torch.long, device=self.device)  # 0 before the first cycle
        self.record = torch.zeros(K + 1, dtype=torch.long, device=self.device)
        self.width = W

    def fused_step(self: FastEngine) -> torch.Tensor:
        """One fused cycle: the tree pass verifies the carried proposal and drafts the next one after every
        acceptance length (``prove.decode.engine.fused``); the rule's twin picks n, and G_n's rows are the next proposal.
        The first cycle of a request carries nothing (``have`` = 0): n = 0, the pass's first row is an AR step and
        G_0 drafts. No host sync, fixed width."""
        K, W, S = self.K, self.width, self.cache.view
        ids = torch.cat([self.last, self.carried, self.mask_fill.repeat(K)])  # (W,) = [c, y, G_0..G_{K−1}]
        slots = self.pos + torch.arange(W, device=self.device)  # chain at slot = position, groups after it
        self.cache.set_slots(slots)
        rel = torch.arange(S, device=self.device) - self.pos  # (S,) a slot's index within the pass
        inside = (rel >= 0) & (rel < W)
        see = (
            torch.index_select(self.tree_local, 1, torch.where(inside, rel, W)) | (rel < 0)[None, :]
        )  # (W, S)
        positions = self.pos + self.tree_pos  # (W,)
        out = self.model(
            input_ids=ids[None],
            position_ids=positions[None],
            past_key_values=self.cache,
            attention_mask=pass_mask(self.model.config, see, positions, self.dtype),
            use_cache=True,
            logits_to_keep=W,
        )
        logits = out.logits[0].float() + self.penalty  # (W, V)
        greedy = logits[:K].argmax(-1)  # (K,): g_1..g_K after c, y_1..y_{K−1}
        n, _ = self.rule(self.carried, greedy)
        n = n * self.have  # nothing carried yet: an AR step
        extra = greedy.gather(0, n.view(1)).view(())
        record = commit_record(self.carried, n, extra)
        rows = self.group_rows.gather(0, n.view(1)) + torch.arange(K - 1, device=self.device)  # G_n's rows
        self.carried.copy_(torch.softmax(logits.index_select(0, rows), -1).argmax(-1))
        self.have.fill_(1)
        self.last.copy_(extra.view(1))
        self.pos.add_(n + 1)
        return record

    def _block_pass(self: FastEngine, k: int, role: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The block pass of ``role``'s model (the target for ``prove``, the draft for ``pard``) over its pending
        tokens and k − 1 placeholders: (p̃ (k,), y (k,)), argmaxes of the restricted softmax on the target's
        vocabulary (ties: the first index, as ``BlockProposer``).

        Its pending tokens are the committed ones its cache lacks (their K/V came from placeholders): ``pend``,
        ``npend`` of them, the last at ``pos``. The pass is [pend (P, padded), M×(k−1)], pend at slot = position from
        ``start`` = pos − npend + 1, the placeholders at positions pos + 1.. in scratch slots start + P.. past every
        pending slot (never kept), so its width is P + k − 1 whatever npend is. A padding row of pend sees what a
        pending row there would (finite, unread); a placeholder row sees the valid prefix, the real pending tokens
        and the placeholders up to itself. Afterwards the cache is valid up to ``pos``."""
        P = self.pend.shape[0]
        W = P + k - 1
        start = self.pos - self.npend + 1
        idx = torch.arange(W, device=self.device)
        ids = torch.cat([self.pend, self.mask_fill[: k - 1]])  # (W,)
        positions = torch.where(idx < P, start + idx, self.pos + 1 + idx - P)  # (W,)
        slots = start + idx
        r, c = idx[:, None], idx[None, :]
        local = torch.where(r < P, c <= r, (c < self.npend) | ((c >= P) & (c <= r)))  # (W, W)
        local = torch.cat([local, local.new_zeros(W, 1)], 1)  # a last column of False: "not in the pass"
        model, cache = self._role(role)
        rel = torch.arange(cache.view, device=self.device) - start  # (S,) a slot's index within the pass
        see = local.index_select(1, torch.where((rel >= 0) & (rel < W), rel, W)) | (rel < 0)[None, :]
        # the rows that propose: the last pending token's and the placeholders' (the LM head runs on these only)
        rows = torch.cat([(self.npend - 1).view(1), P + torch.arange(k - 1, device=self.device)])  # (k,)
        mask = pass_mask(model.config, see, positions, self.dtype)
        logits = self._logits(model, cache, ids, positions, slots, mask, rows)
        return torch.softmax(self._on_target_vocab(logits, role), -1).max(-1)  # (k,), (k,)

    def prove_step(self: FastEngine, k: int) -> torch.Tensor:
        """One ``prove`` cycle (greedy): the target's block pass (``_block_pass``: its pending tokens are the
        committed y's) proposes y_1..y_k with p̃_i, the verifier's pass over [last, y_1..y_k] gives q_i, the rule's
        twin commits the leading run of p̃_i·q_i ≥ θ (y_1 always), with no correction token. The verifier's cache is
        valid below ``pos`` after every cycle (it re-reads the last committed token), as the composed cycle's runner is."""
        K = self.K
        # 1) propose
        conf, y = self._block_pass(k, "model")  # (k,), (k,)
        # 2) score: the verifier's own, unrestricted q_i, teacher-forced over [last, y_1..y_k]
        chain = torch.cat([self.last, y])  # (k+1,)
        q_logits = self._forward(chain, self.pos, k + 1, role="verifier")  # (k+1, the verifier's V)
        q = torch.softmax(q_logits[:k], -1).gather(-1, y[:, None])[:, 0]  # (k,)
        # 3) accept: the rule's sync-free twin; 4) commit: y_1..y_n become the target's pending tokens
        n = prove_rule_twin(conf, q, self.theta)
        self.pend.copy_(torch.cat([y, self.pend[k:]]))
        self.npend.copy_(n)
        self.last.copy_(y.gather(0, (n - 1).view(1)))
        self.pos.add_(n)
        return torch.cat([n.view(1), y, y.new_zeros(K + 1 - k)])  # (K + 2,): [n, y_1..y_k, stale]

    def _logits(
        self: FastEngine,
        model: Any,
        cache: SlotCache,
        ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        mask: Any,
        rows: int | torch.Tensor,
    ) -> torch.Tensor:
        """``model`` over ``ids`` (W,) at ``positions``, written at ``slots`` of ``cache``, under the float ``mask``
        (``pass_mask``'s tensor or per-layer-type mapping; None: no mask, ``_unmasked``):
        the logits of its last ``rows`` rows, or of the rows a (R,) long tensor names (transformers' ``logits_to_keep``
        takes either), in float32, as the model gives them: (rows or R, its V)."""
        cache.set_slots(slots)
        out = model(
            input_ids=ids[None],
            position_ids=positions[None],
            past_key_values=cache,
            attention_mask=mask,
            use_cache=True,
            logits_to_keep=rows,
        )
        return (out.logits[0] if isinstance(rows, torch.Tensor) else out.logits[0, -rows:]).float()

    def _draw(self: FastEngine, logits: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A sampled draft position: its warped distribution (1, V) and the token (1,) drawn from it with the
        cycle's uniform u[i] (inverse CDF, ``rules.speculative.sample_from_probs``)."""
        probs = warp_probs(logits, self.temperature, top_p=self.top_p, top_k=self.top_k)  # (1, V)
        assert self.uniforms is not None
        return probs, sample_from_probs(probs, self.uniforms[i : i + 1])

    def _sampled_rule(
        self: FastEngine, y: torch.Tensor, draft_probs: torch.Tensor, target_logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Speculative sampling's twin on the warped target (k + 1, V) with the cycle's uniforms u[K:K+k+1]."""
        k = y.shape[0]
        target = warp_probs(target_logits, self.temperature, top_p=self.top_p, top_k=self.top_k)
        assert self.uniforms is not None
        return sd_sample_twin(y, draft_probs, target, self.uniforms[self.K : self.K + k + 1])

    def pard_step(self: FastEngine, k: int) -> torch.Tensor:
        """One ``pard`` cycle: the draft's block pass (``_block_pass``: its pending tokens are everything committed
        since its last pass, the correction / bonus included, so up to K + 1 of them) proposes y_1..y_k, the target's
        verification pass over [last, y_1..y_k] and the greedy rule's twin commit y_1..y_n and the greedy token. k = 0
        (the request's last token) runs no draft pass, as the composed cycle proposes nothing: no cycle follows it."""
        if k > 0:
            _, y = self._block_pass(k, "draft")  # (k,)
        else:
            y = self.last[:0]
        greedy = self._forward(torch.cat([self.last, y]), self.pos, k + 1).argmax(-1)  # (k+1,)
        n, extra = self.rule(y, greedy)
        committed = torch.cat([y, y.new_zeros(1)]).scatter(
            0, n.view(1), extra.view(1)
        )  # [y_1..y_n, extra, ...]
        self.pend.copy_(torch.cat([committed, self.pend[k + 1 :]]))
        self.npend.copy_(n + 1)
        self.last.copy_(extra.view(1))
        self.pos.add_(n + 1)
        return commit_record(y, n, extra)

    def _role(self: FastEngine, role: str) -> tuple[Any, SlotCache]:
        """The model of ``role`` (``model``: the target; ``draft``; ``verifier``) and its slot cache."""
        model, cache = {
            "model": (self.model, self.cache),
            "draft": (self.draft, getattr(self, "draft_cache", None)),
            "verifier": (self.verifier, getattr(self, "verifier_cache", None)),
        }[role]
        assert cache is not None, f"no {role} model on this engine"
        return model, cache

    def _on_target_vocab(self: FastEngine, logits: torch.Tensor, role: str) -> torch.Tensor:
        """``role``'s float logits (rows, its V) on the target's vocabulary, restricted to the allowed ids (a draft's
        rows cut or padded with −inf to the target's, as ``DraftProposer`` and ``fit_vocab`` do)."""
        if role == "draft":
            V = self.penalty.shape[0]
            rows = logits.shape[0]
            logits = (
                logits[:, :V]
                if logits.shape[-1] >= V
                else torch.cat([logits, self.draft_pad.expand(rows, -1)], -1)
            )
        return logits + self.penalty  # (rows, V)

    def _forward(
        self: FastEngine, ids: torch.Tensor, start: torch.Tensor, rows: int, *, role: str = "model"
    ) -> torch.Tensor:
        """The model of ``role`` (the target ``model``, the ``draft`` or the ``verifier``) over ``ids`` (W,) at
        positions = slots start..start+W−1 on its slot cache; logits of the last ``rows`` in float32. The target's
        and the draft's (rows, V) are on the target's vocabulary, restricted to the allowed ids (a draft's rows cut
        or padded with −inf to the target's, as ``DraftProposer`` does); the verifier's are its own, unrestricted
        (ProVe's q, as ``ModelVerifier`` gives it)."""
        model, cache = self._role(role)
        prefix = self._prefix.pop(role, None)
        if prefix is not None:  # the request's first pass of this model: the prompt rides on it (``prefill``)
            ids, start = torch.cat([prefix, ids]), start - prefix.shape[0]
        w = ids.shape[0]
        positions = start + torch.arange(w, device=self.device)  # (W,)
        if w == 1 and self._unmasked(model, cache, start):
            mask = None
        else:
            mask = pass_mask(model.config, linear_see(start, w, cache.view), positions, self.dtype)
        logits = self._logits(
            model, cache, ids, positions, positions, mask, rows
        )  # (rows, V or the draft's Vd)
        return logits if role == "verifier" else self._on_target_vocab(logits, role)

    def _unmasked(self: FastEngine, model: Any, cache: SlotCache, start: torch.Tensor) -> bool:
        """Whether a one-row pass at slot ``start`` runs without a mask: on an eager CPU engine (exact views, where
        reading ``start`` is no sync), under sdpa with full attention, when the row is the view's last slot, so it
        sees every slot of the view, which is what sdpa does with no mask for one query (transformers passes none
        either). The masked kernel costs more on a CPU than the unmasked one (docs/benchmarks.md)."""
        return (
            self.exact_views
            and self.device.type == "cpu"
            and getattr(model.config, "_attn_implementation", None) in ("sdpa", GROUPED_SDPA)
            and attention_window(model.config)[0] is None
            and int(start) + 1 == cache.view
        )

    def draft_step(self: FastEngine, k: int) -> torch.Tensor:
        """One speculative-decoding cycle (``sd`` greedy or sampled, greedy ``asd``): the draft's k passes — the first over [prev, last] at
        pos − 1, pos (prev's K/V recomputed: it is missing after a cycle that accepted the whole draft), then one
        token each — the target's verification pass over [last, y_1..y_k], the rule's twin, and the next prev /
        last / pos. The draft's cache is valid below the new prev's position after every cycle, as the target's is
        below last's. (k = 0, the request's last token, leaves the draft's cache one short: no cycle follows.)"""
        ys, qs = [], []
        tok = torch.cat([self.prev, self.last])  # the first pass re-feeds prev
        for i in range(k):
            logits = self._forward(tok, self.pos + (i if i > 0 else -1), 1, role="draft")  # (1, V)
            if self.uniforms is None:
                tok = torch.softmax(logits, -1).argmax(-1)  # (1,)
            else:  # sampled: y_i from the draft's warped distribution q_i, with the cycle's uniform u_i
                q, tok = self._draw(logits, i)
                qs.append(q)
            ys.append(tok)
        y = torch.cat(ys) if ys else self.last[:0]  # (k,)
        chain = torch.cat([self.last, y])  # (k+1,): the tokens at pos..pos+k
        target = self._forward(chain, self.pos, k + 1)  # (k+1, V)
        if (
            self.asd is not None
        ):  # the proposal the composed cycle drafts ends at its first EOS: K of the gate
            proposed = (leading_true(~self.is_eos.index_select(0, y)) + 1).clamp(max=k)
            n, extra, spent = asd_greedy_twin(y, target, self.spent, block_size=proposed, **self.asd)
            self.spent.copy_(spent)
        elif self.uniforms is None:
            n, extra = self.rule(y, target.argmax(-1))
        else:
            n, extra = self._sampled_rule(y, torch.cat(qs) if qs else target[:0], target)
        self.prev.copy_(chain.gather(0, n.view(1)))
        self.last.copy_(extra.view(1))
        self.pos.add_(n + 1)
        return commit_record(y, n, extra)

    def step(self: FastEngine, k: int) -> torch.Tensor:
        """One cycle with a block of ``k`` (0 = AR): reads and advances ``last`` / ``pos`` in place and returns the
        record (k + 2,): [committed count, tokens...]. No host sync, no shape that depends on a value. Fused: the
        fused cycle (``fused_step``; k is always K)."""
        if self.fused:
            return self.fused_step()
        if self.draft is not None:
            return self.pard_step(k) if self.block_draft else self.draft_step(k)
        if self.verifier is not None:
            return self.prove_step(k)
        if self.uniforms is not None:  # sampled ar (k = 0): the bonus draw of speculative sampling's twin
            logits = self._forward(self.last, self.pos, 1)  # (1, V)
            n, extra = self._sampled_rule(self.last[:0], logits[:0], logits)
            self.last.copy_(extra.view(1))
            self.pos.add_(1)
            return commit_record(self.last[:0], n, extra)
        if k > 0:
            # 1) propose: the block pass [last, M×(k−1)]; y_i = argmax of the softmax (ties: first index, as the
            # reference BlockProposer)
            block = torch.cat([self.last, self.mask_fill[: k - 1]])  # (k,)
            proposal = self._forward(block, self.pos, k)  # (k, V)
            y = torch.softmax(proposal, -1).argmax(-1)  # (k,)
            # 2) verify: [y_1..y_k] at pos + 1.. (the placeholders' K/V overwritten). g_1, the greedy token after
            # last, is the block pass's row 0: the same token at the same slot over the same prefix, the row the
            # verify pass would recompute (the composed cycle's narrower verification, ``ModelRunner._known_row``):
            # k rows, not k + 1, so both passes of a cycle have the block's width
            greedy = torch.cat([proposal[:1].argmax(-1), self._forward(y, self.pos + 1, k).argmax(-1)])
        else:
            y = self.last[:0]
            greedy = self._forward(self.last, self.pos, 1).argmax(-1)  # (1,): the last token's AR step
        # 3) accept: the rule's sync-free twin; 4) commit on the device: the new pending token and its position
        n, extra = self.rule(y, greedy)
        self.last.copy_(extra.view(1))
        self.pos.add_(n + 1)
        return commit_record(y, n, extra)
