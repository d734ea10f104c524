"""The server's request check of a plugin engine (``prove-serve`` for ``prove``, ``nsd``, ``asd``): an ASGI "http"
middleware, ``check_<method>_requests``, which the server names ``prove.decode.vllm.plugin.check_<method>_requests``
(:func:`prove.decode.vllm.plugin.middleware`; the plugin module loads it from here on first access).

Default-deny: a body on a generating path (:data:`SERVED_PATHS`) is checked by :func:`check_request` before vLLM
parses it (a 400 naming the field and the fix), a POST anywhere else is a 404 naming what the server serves. No vLLM
is imported here (the server imports it; this module is tested without an engine)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from prove.decode.vllm.plugin import plugin_methods, resolve_request, rule_keys

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
    return {k: getattr(params, k) for k in rule_keys(method)}


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

    check.__name__ = f"check_{method.replace('-', '_')}_requests"
    return check


def __getattr__(name: str) -> Any:
    """``check_<method>_requests``: the middleware of a plugin method's server (``-`` in a method's name as ``_``)."""
    for method in plugin_methods():
        if name == f"check_{method.replace('-', '_')}_requests":
            return _request_checker(method)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
