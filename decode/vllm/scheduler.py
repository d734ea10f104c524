"""The plugin's scheduler (``prove.decode.vllm.plugin``): vLLM's ``Scheduler``, subclassed, the ``scheduler_cls`` of a
plugin method's engine (``plugin.scheduler_cls``), so that every step after a request's first follows our rule at
any load (:class:`RuleScheduler`).

vLLM is imported here: this module loads in the engine's process (vLLM resolves ``scheduler_cls``)."""

from __future__ import annotations

from typing import Any

from prove.decode.vllm.plugin import drafts_scored, resolve_request, rule_settings, stop_ids
from vllm.logger import init_logger
from vllm.sampling_params import SamplingType
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.request import RequestStatus

logger = init_logger(__name__)


class RuleScheduler(Scheduler):
    """vLLM's scheduler, so that every step after a request's first follows our rule at any load.

    1. A preempted request resumes on our rule. vLLM drops its drafts and recomputes it, and the step that
       completes that prefill would sample the next token from the target (``prove``: the verifier's token).
       Here the resumed prefill stops one token short: the last committed token is left for the next step,
       where the drafter's block after it (proposed on the prefill step, as after any partial prefill, and
       kept here where vLLM drops a prefill chunk's drafts) is verified with it, our engine's next cycle. A
       resumed request reads no prefix cache: a hit could leave that one token alone, a step vLLM pads with
       placeholder drafts and the target would answer.
    2. A step vLLM pads with placeholder drafts (a new request with one token to compute beside running ones:
       a one-token prompt, a prefix-cache hit) is its prefill, not a drafting step: it is left out of the
       request's speculative metrics (vLLM records K drafted, 0 accepted), so the stats have no phantom cycle.
       Drafts our rule does not score (past ``max_tokens`` or a drafted EOS: :func:`drafts_scored`) are not
       counted as drafted, as our engine never proposes them.
    3. A request our rule cannot serve (one that samples, or with extra arguments the method's checks refuse,
       sent past the server's gate, e.g. through ``vllm.LLM``) is finished when it arrives with vLLM's
       ``FINISHED_ERROR`` (finish reason ``error``; a 500 for that request on the server), before any step.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refused: list[Any] = []  # finished on arrival, their error output not yet sent

    def add_request(self, request: Any) -> None:
        new = request.request_id not in self.requests  # not a streaming session's next chunk
        super().add_request(request)
        why = self._refusal(request.sampling_params) if new else None
        if why is not None:
            logger.error("prove plugin: request %s refused (%s)", request.request_id, why)
            self.finish_requests(request.request_id, RequestStatus.FINISHED_ERROR)
            self.refused.append(request)

    def _refusal(self, sampling_params: Any) -> str | None:
        settings = rule_settings(self.vllm_config)
        if sampling_params.sampling_type != SamplingType.GREEDY:
            return f"method={settings['method']} on vLLM is greedy: send requests with temperature 0"
        try:
            resolve_request(settings, sampling_params.extra_args)
        except ValueError as e:
            return str(e)
        return None

    def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> None:
        super()._preempt_request(request, *args, **kwargs)
        request.skip_reading_prefix_cache = True

    def _update_after_schedule(self, scheduler_output: Any) -> None:
        scheduled = scheduler_output.num_scheduled_tokens
        for rid, n in scheduled.items():
            request = self.requests[rid]
            resumed_last_chunk = (
                request.num_output_tokens > 0
                and rid not in scheduler_output.scheduled_spec_decode_tokens
                and request.num_computed_tokens + n == request.num_tokens
            )
            if resumed_last_chunk and n > 1:
                scheduled[rid] = n - 1  # the last committed token waits for the drafter's block
                scheduler_output.total_num_scheduled_tokens -= 1
        super()._update_after_schedule(scheduler_output)

    def update_draft_token_ids(self, draft_token_ids: Any) -> None:
        super().update_draft_token_ids(draft_token_ids)
        for rid, drafts in zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids, strict=True):
            request = self.requests.get(rid)
            if (
                request is not None
                and not request.is_finished()
                and request.is_prefill_chunk
                and request.num_output_tokens > 0
                and request.num_computed_tokens == request.num_tokens - 1
                and not request.spec_token_ids
            ):  # a resumed prefill one short of its last token: the block after that token
                request.spec_token_ids = list(drafts)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        padded = [
            self.requests[rid]
            for rid, drafts in scheduler_output.scheduled_spec_decode_tokens.items()
            if rid in self.requests and drafts and all(t == -1 for t in drafts)
        ]
        method = rule_settings(self.vllm_config)["method"]
        unscored = dict(scheduler_output.num_invalid_spec_tokens or {})
        for rid, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
            request = self.requests.get(rid)
            if request is None or not drafts or request in padded:
                continue
            sp = request.sampling_params
            assert sp is not None and sp.max_tokens is not None, "a generation request has its max_tokens"
            left = sp.max_tokens - request.num_output_tokens
            n = drafts_scored(method, list(drafts), left=left, eos=stop_ids(sp))
            if n < len(drafts):
                unscored[rid] = unscored.get(rid, 0) + len(drafts) - n
        scheduler_output.num_invalid_spec_tokens = unscored or None  # read by vLLM's metrics only
        kept = [(request, request.spec_decode_metrics) for request in padded]
        for request in padded:
            request.spec_decode_metrics = None  # vLLM observes a step only where a request has metrics
        try:
            outputs = super().update_from_output(scheduler_output, model_runner_output)
        finally:
            for request, metrics in kept:
                request.spec_decode_metrics = metrics
        for request in self.refused:  # finished on arrival: their one output, as vLLM's own error finishes
            out = EngineCoreOutput(
                request_id=request.request_id,
                new_token_ids=[],
                finish_reason=request.get_finished_reason(),
                events=request.take_events(),
                trace_headers=request.trace_headers,
            )
            if request.client_index in outputs:
                outputs[request.client_index].outputs.append(out)
            else:
                outputs[request.client_index] = EngineCoreOutputs(outputs=[out])
        self.refused.clear()
        return outputs
