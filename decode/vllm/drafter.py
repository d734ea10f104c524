"""The plugin's drafters (``prove.decode.vllm.plugin``): vLLM's draft-model drafter (``DraftModelProposer``), subclassed.

- :class:`ScheduledDrafter`: its parallel slots follow each step's K under a K schedule, no pass at K = 0 (what it
  missed is fed on its next pass, :class:`~prove.decode.vllm.plugin.MissedTokens`); vLLM's own lossless parallel
  methods (``prove-lossless``, ``pard``) get it alone under ``VllmOptions.k_schedule``.
- :class:`RuleDrafter`: drafts as vLLM does, but restricted to the ids the request may output (vLLM restricts only
  the target) and keeping p̃ (the drafter's probability of each argmax draft: vLLM keeps draft probabilities only for
  probabilistic drafting of a sampling batch), which ``prove``'s rule reads. One for every plugin method.

vLLM is imported here: this module loads in the engine's process (``worker.install_rule``)."""

from __future__ import annotations

from typing import Any

import torch
from prove.decode.vllm.plugin import MissedTokens
from vllm.v1.spec_decode.draft_model import DraftModelProposer


class ScheduledDrafter(DraftModelProposer):
    """vLLM's parallel drafter, its slots laid out per step for the K vLLM's batch-size schedule hands it
    (``num_speculative_tokens_per_batch_size``): vLLM's lays out the K it was built with whatever K a step asks
    for, so below it a batch's drafts land on the wrong requests. A step of K = 0 runs no pass: the tokens the
    target computed in it are kept (:class:`MissedTokens`) and fed to the drafter before its own on its next pass,
    as far as that pass's token buffer has room (a request that does not fit keeps them, with the pass's own
    tokens, for a later one), so the drafter's KV cache holds every token again before it drafts. For vLLM's own
    lossless methods (``prove-lossless``, ``pard``): a schedule changes no output of theirs."""

    def __init__(self, *, vllm_config: Any, device: Any, runner: Any) -> None:
        super().__init__(vllm_config=vllm_config, device=device, runner=runner)
        self.sched_runner = runner  # the base class does not keep it
        self.missed = MissedTokens()
        self.passes = self.skipped = self.refed = 0  # drafter passes run, skipped; tokens re-fed

    def propose(  # type: ignore[override]  # vLLM's signature moves between its releases; this is 0.32's
        self,
        num_speculative_tokens: int,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor,
        next_token_ids: torch.Tensor,
        token_indices_to_sample: torch.Tensor | None,
        common_attn_metadata: Any,
        sampling_metadata: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        k, cad = int(num_speculative_tokens), common_attn_metadata
        rids = self.sched_runner.input_batch.req_ids[: cad.batch_size()]
        self.missed.forget(self.sched_runner.requests)
        if self.parallel_drafting and k == 0:  # no drafts asked: keep what the pass would feed, run none
            bounds = cad.query_start_loc_cpu.tolist()
            tokens, positions = target_token_ids.clone(), target_positions.clone()  # (tokens,) each
            for j, rid in enumerate(rids):
                if bounds[j + 1] > bounds[j]:
                    self.missed.add(
                        rid, tokens[bounds[j] : bounds[j + 1]], positions[bounds[j] : bounds[j + 1]]
                    )
            self.num_speculative_tokens, self.skipped = 0, self.skipped + 1
            return torch.empty((len(rids), 0), dtype=torch.int64, device=target_token_ids.device)
        if self.parallel_drafting:  # [next token, <|mask|> × (K - 1)] a request
            self.extra_slots_per_request = self.net_num_new_slots_per_request = k
            if any(rid in self.missed for rid in rids):
                target_token_ids, target_positions, cad = self._refeed(
                    k, rids, target_token_ids, target_positions, cad
                )
        self.passes += 1
        return super().propose(
            num_speculative_tokens=k,
            target_token_ids=target_token_ids,
            target_positions=target_positions,
            target_hidden_states=target_hidden_states,
            next_token_ids=next_token_ids,
            token_indices_to_sample=token_indices_to_sample,
            common_attn_metadata=cad,
            sampling_metadata=sampling_metadata,
            **kwargs,
        )

    def _refeed(
        self, k: int, rids: list[str], tokens: torch.Tensor, positions: torch.Tensor, cad: Any
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """This pass's inputs with each request's missed tokens put before its own: the tokens, their positions
        and the attention metadata (each query longer by them, the sequence lengths as they were: the missed
        positions are already counted in them; their KV slots from the request's block table)."""
        bounds = cad.query_start_loc_cpu.tolist()
        firsts = positions[torch.tensor(bounds[:-1]).clamp(max=len(positions) - 1)].tolist()
        room = self.max_num_tokens - len(tokens) - k * len(rids)  # its buffers hold max_num_tokens
        size = self.block_size
        out_t, out_p, out_s, starts = [], [], [], [0]
        for j, rid in enumerate(rids):
            s, e = bounds[j], bounds[j + 1]
            missed_t, missed_p = (
                self.missed.refeed(rid, firsts[j]) if rid in self.missed and e > s else ([], [])
            )
            if len(missed_t) > room:  # no room this pass: kept with this pass's tokens, fed later
                self.missed.add(rid, tokens[s:e].clone(), positions[s:e].clone())
                missed_t = missed_p = []
            elif rid in self.missed and e > s:
                self.missed.clear(rid)
                room -= len(missed_t)
            if missed_t:
                p = torch.tensor(missed_p, dtype=positions.dtype, device=positions.device)
                block = cad.block_table_tensor[j, p // size].to(cad.slot_mapping.dtype)
                out_t.append(torch.tensor(missed_t, dtype=tokens.dtype, device=tokens.device))
                out_p.append(p)
                out_s.append(block * size + p % size)
                self.refed += len(missed_t)
            out_t.append(tokens[s:e])
            out_p.append(positions[s:e])
            out_s.append(cad.slot_mapping[s:e])
            starts.append(starts[-1] + len(missed_t) + e - s)
        loc = torch.tensor(starts, dtype=cad.query_start_loc_cpu.dtype)
        new_positions = torch.cat(out_p)
        cad = cad.replace(
            query_start_loc=loc.to(cad.query_start_loc.device),
            query_start_loc_cpu=loc,
            num_actual_tokens=starts[-1],
            max_query_len=max(b - a for a, b in zip(starts, starts[1:], strict=False)),
            slot_mapping=torch.cat(out_s),
            positions=None if cad.positions is None else new_positions,
            _num_computed_tokens_cache=None,
            _token_to_req_indices_cache=None,
        )
        return torch.cat(out_t), new_positions, cad


class RuleDrafter(ScheduledDrafter):
    """vLLM's draft-model drafter, restricted to the ids each request may output (the request's
    ``allowed_token_ids``, as our proposers are) and keeping p̃ of every draft by request (:attr:`kept`); under a
    K schedule (K ≥ 1) its parallel slots follow each step's K (:class:`ScheduledDrafter`)."""

    def __init__(self, *, vllm_config: Any, device: Any, runner: Any) -> None:
        super().__init__(vllm_config=vllm_config, device=device, runner=runner)
        self.rule_runner = runner  # the base class does not keep it
        self.kept: dict[str, tuple[list[int], torch.Tensor]] = {}
        self._conf: list[torch.Tensor] = []

    def _sample_draft_tokens(self, hidden_states: torch.Tensor, sampling_metadata: Any) -> Any:
        logits = self.model.compute_logits(hidden_states).float()  # type: ignore[operator]  # a vLLM model  # (rows, V): batch × K, or batch
        banned = sampling_metadata.allowed_token_ids_mask  # (batch, V) True = not allowed, or None
        if banned is not None:
            per = logits.shape[0] // banned.shape[0]  # parallel drafting: K rows a request, request-major
            logits = logits.masked_fill(banned.repeat_interleave(per, 0)[: logits.shape[0]], float("-inf"))
        conf, ids = logits.softmax(-1).max(-1)  # p̃ of the argmax draft, (rows,)
        self._conf.append(conf)
        return ids, None  # no draft probabilities: the runner's probabilistic path stays off

    def propose(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self._conf = []
        drafts = super().propose(*args, **kwargs)  # (batch, K)
        if self.parallel_drafting and drafts.shape[-1] > 0:
            conf = self._conf[-1].view(drafts.shape)
            ids = self.rule_runner.input_batch.req_ids[: drafts.shape[0]]
            rows = drafts.tolist()
            self.kept = {rid: (rows[j], conf[j].clone()) for j, rid in enumerate(ids)}
        return drafts
