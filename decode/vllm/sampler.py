"""The plugin's sampler (``prove.decode.vllm.plugin``): vLLM's ``RejectionSampler``, subclassed, with our rule in
place of its acceptance (greedy requests only).

Each request's drafts go through our pure rule (``prove.decode.rules``), the one of the engine's method
(:data:`RULES`): ``prove_rule`` (the drafts d₁..d_m, d₁ always, d_i while p̃_i·q_i ≥ θ, no verifier token),
``nsd_greedy``, ``asd_greedy`` (its regret budget per request, freed when the request ends). A request the rule
cannot serve is ended alone (:meth:`RuleSampler._fail`); the step goes on.

vLLM is imported here: this module loads in the engine's process (``worker.install_rule``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from prove.decode.rules.block import prove_rule
from prove.decode.rules.speculative import AsdState, asd_greedy, nsd_greedy
from prove.decode.vllm.plugin import TESTED_VLLM, drafts_scored, resolve_request, stop_ids, vllm_version
from vllm.logger import init_logger
from vllm.sampling_params import SamplingType
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID, RejectionSampler

logger = init_logger(__name__)


@dataclass(frozen=True)
class Step:
    """One request's row of an engine step, as a rule reads it."""

    rid: str
    drafts: list[int]
    """The step's drafts (vLLM's placeholders cut off)."""
    n: int
    """How many of them our rule scores (``plugin.drafts_scored``)."""
    rows: torch.Tensor
    """(len(drafts), V): the target's logits at the drafts, unrestricted."""
    bonus: torch.Tensor
    """(V,): the target's logits after the last draft, restricted to the request's ids."""
    banned: torch.Tensor | None
    """(V,) True = an id the request may not output, or None."""
    params: dict[str, Any]
    """The request's rule parameters (``plugin.resolve_request``)."""

    def scored(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(the n scored drafts, the target's rows over them and the one after them (n+1, V)), restricted as our
        verifier restricts the target's: what a rule that adds a correction / bonus token reads."""
        z = torch.cat([self.rows, self.bonus[None]])[: self.n + 1]
        if self.banned is not None:
            z = z.masked_fill(self.banned, float("-inf"))
        return torch.tensor(self.drafts[: self.n], device=z.device), z


def _prove(sampler: RuleSampler, step: Step) -> list[int]:
    """ProVe: the verifier (vLLM's target) scores the MARS drafter's block; d₁ always, no verifier token."""
    ids, conf = sampler.drafter.kept.get(step.rid, (None, None))
    if ids is None or ids[: len(step.drafts)] != step.drafts:
        raise RuntimeError(
            f"prove plugin: the drafts vLLM verifies for request {step.rid} are not the ones its drafter "
            f"kept p̃ for (vLLM {vllm_version()}'s internals differ from {TESTED_VLLM}'s)"
        )
    n = step.n
    # q: the verifier's own distribution, unrestricted (as our engine's) but for its padded rows
    q_logits = step.rows[:n].clone()
    q_logits[:, sampler.settings.get("verifier_rows", q_logits.shape[-1]) :] = float("-inf")
    tokens = torch.tensor(step.drafts[:n], device=step.rows.device)
    q = q_logits.softmax(-1).gather(-1, tokens[:, None])[:, 0]  # (n,)
    verdict = prove_rule(conf[:n].to(q.device), q, step.params["theta"])
    return step.drafts[: verdict.n]


def _nsd(sampler: RuleSampler, step: Step) -> list[int]:
    """NSD, greedy: a draft inside the target's top-θ nucleus is accepted; the correction / bonus token kept."""
    tokens, z = step.scored()
    verdict = nsd_greedy(tokens, z, step.params["theta"])
    return [*step.drafts[: verdict.n], int(verdict.extra)]


def _asd(sampler: RuleSampler, step: Step) -> list[int]:
    """ASD: greedy, with the request's regret budget (kept across its steps in ``sampler.state``)."""
    tokens, z = step.scored()
    verdict, sampler.state[step.rid] = asd_greedy(
        tokens, z, sampler.state.get(step.rid, AsdState()), block_size=step.n, **step.params
    )
    return [*step.drafts[: verdict.n], int(verdict.extra)]


RULES: dict[str, Callable[[RuleSampler, Step], list[int]]] = {"prove": _prove, "nsd": _nsd, "asd": _asd}
"""The plugin's rules, by the engine's method (the rule its registry entry runs in vLLM's step, ``OnVllm.plugin``):
one request's output row of a step."""


class RuleSampler(RejectionSampler):
    """vLLM's rejection sampler with our rule in place of its acceptance (greedy requests only)."""

    def __init__(
        self,
        sampler: Any,
        spec_config: Any,
        device: Any,
        *,
        settings: Mapping[str, Any],
        runner: Any,
        drafter: Any,
    ) -> None:
        super().__init__(sampler, spec_config, device)
        self.settings = dict(settings)
        self.method = self.settings["method"]
        if self.method not in RULES:
            raise ValueError(
                f"method={self.method} runs our rule in vLLM's step (its registry entry: OnVllm(plugin=True)), and "
                f"the plugin has no rule of that name ({', '.join(RULES)}): add its row rule to {__name__}.RULES, "
                "or let vLLM's own rule run it (plugin=False)"
            )
        self.rule = RULES[self.method]
        self.runner, self.drafter = runner, drafter
        self.params: dict[str, dict[str, Any]] = {}
        self.state: dict[str, Any] = {}  # a rule's state across a request's steps (ASD's regret budget)
        self.failed: dict[str, str] = {}  # request id -> why the plugin ended it

    def forward(self, metadata: Any, draft_probs: Any, logits: torch.Tensor, sampling_metadata: Any) -> Any:
        """Each request's row by our rule. Never raises: a request the rule cannot serve (one that samples, bad
        extra arguments, or any error in its row) is ended by :meth:`_fail` alone, and the step goes on."""

        target = logits[metadata.target_logits_indices].float()  # (drafts, V)
        bonus = logits[metadata.bonus_logits_indices].float()  # (batch, V)
        banned = sampling_metadata.allowed_token_ids_mask  # (batch, V) or None
        req_ids = self.runner.input_batch.req_ids
        counts = metadata.num_draft_tokens
        drafts_all = metadata.draft_token_ids.tolist()
        out = torch.full((len(counts), metadata.max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32)
        start = 0
        for j, n in enumerate(counts):
            rid = req_ids[j]
            drafts, rows = drafts_all[start : start + n], target[start : start + n]
            start += n
            mask = None if banned is None else banned[j]
            try:
                why = self.failed.get(rid) or self._refusal(rid)
                row = self._row(rid, drafts, rows, bonus[j], mask) if why is None else None
            except Exception as e:  # noqa: BLE001 - one request's failure must not end the engine step
                why, row = f"{type(e).__name__}: {e}", None
            if row is None:
                row = self._fail(rid, why or "the rule gave no row", rows[0] if n else bonus[j], mask)
            out[j, : len(row)] = torch.tensor(row, dtype=torch.int32)
        self._forget_finished()
        for rid in [r for r in self.failed if r not in self.runner.requests]:
            del self.failed[rid]
        return SamplerOutput(sampled_token_ids=out.to(logits.device), logprobs_tensors=None)

    def _refusal(self, rid: str) -> str | None:
        """Why our rule cannot serve this request (what the server refuses with a 400), or None."""
        sp = self.runner.requests[rid].sampling_params
        if sp.sampling_type != SamplingType.GREEDY:
            return f"method={self.method} on vLLM is greedy: send requests with temperature 0"
        try:
            self._request(rid)
        except ValueError as e:
            return str(e)
        return None

    def _fail(self, rid: str, why: str, logits: torch.Tensor, banned: torch.Tensor | None) -> list[int]:
        """End one request the rule cannot serve, alone: vLLM 0.32 gives a worker no way to finish a request
        with an error (``FINISHED_ERROR`` is set by its scheduler only), so its row is its own stop token, which
        vLLM's stop check ends it on (finish reason ``stop``), logged with the reason. A request with no stop
        token gets the target's greedy token each step until its length ends it."""
        state = self.runner.requests[rid]
        sp = state.sampling_params
        if rid not in self.failed:
            self.failed[rid] = why
            logger.error("prove plugin: request %s ended by the plugin (%s)", rid, why)
        stops = [sp.eos_token_id, *(sp.stop_token_ids or ())]
        stop = next((t for t in stops if t is not None), None)
        if stop is not None:
            return [int(stop)]
        if banned is not None:
            logits = logits.masked_fill(banned, float("-inf"))
        return [int(logits.argmax())]

    def _request(self, rid: str) -> tuple[dict[str, Any], Any]:
        state = self.runner.requests[rid]
        if rid not in self.params:
            self.params[rid] = resolve_request(self.settings, state.sampling_params.extra_args)
        return self.params[rid], state

    def _cut(self, state: Any, drafts: list[int]) -> int:
        """How many drafts our engine would have proposed: no more than the request may still take (less
        the correction / bonus token), and a drafted EOS (a stop id or the primary EOS) ends a draft model's
        block."""
        sp = state.sampling_params
        left = sp.max_tokens - len(state.output_token_ids)
        return drafts_scored(self.method, drafts, left=left, eos=stop_ids(sp))

    def _row(
        self,
        rid: str,
        drafts: list[int],
        rows: torch.Tensor,
        bonus: torch.Tensor,
        banned: torch.Tensor | None,
    ) -> list[int]:
        """One request's output row: our rule's verdict on its drafts (``rows``: the target's logits at them,
        ``bonus`` after the last)."""
        params, state = self._request(rid)
        if PLACEHOLDER_TOKEN_ID in drafts:
            # vLLM schedules a new request with one token to compute beside running ones as a decode with K
            # placeholder drafts (scheduler.py, ``pad_spec_decode``): none of them is a draft
            drafts = drafts[: drafts.index(PLACEHOLDER_TOKEN_ID)]
            bonus = rows[len(drafts)] if len(drafts) < len(rows) else bonus
        if banned is not None:
            bonus = bonus.masked_fill(banned, float("-inf"))
        if not drafts:  # a step without drafts (the prefill): the target's greedy token
            return [int(bonus.argmax())]
        step = Step(rid, drafts, self._cut(state, drafts), rows, bonus, banned, params)
        return self.rule(self, step)

    def _forget_finished(self) -> None:
        live = self.runner.requests
        for table in (self.params, self.state):
            for rid in [r for r in table if r not in live]:
                del table[rid]
