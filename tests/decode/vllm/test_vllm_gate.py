"""The gate in front of a plugin engine (``prove``, ``nsd``, ``asd`` on vLLM; ``prove.decode.vllm.gate``, ``.sampler``), without
starting vLLM: the server's middleware is default-deny and refuses, with one line naming the field, every request
body our rule would not serve; the plugin's sampler ends a request it cannot serve alone, never raising in the engine
step; a drafted primary EOS ends a draft model's block; async scheduling is off. The live server under load is
test_vllm_load.py."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
import torch
from prove.decode.vllm import gate
from prove.decode.vllm import plugin as vllm_plugin
from prove.decode.vllm.gate import SERVED_PATHS, check_request

OK = {"temperature": 0, "max_tokens": 8, "vllm_xargs": {"theta": 0.2}}

BAD = [
    # (body update, the field the one-line reason must name)
    ({"temperature": 0.7}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": None}, "temperature"),
    ({"vllm_xargs": [1, 2]}, "vllm_xargs"),
    ({"vllm_xargs": "theta=0.2"}, "vllm_xargs"),
    ({"vllm_xargs": {"theta": "high"}}, "vllm_xargs.theta"),
    ({"vllm_xargs": {"beta": 1}}, "beta"),
    ({"vllm_xargs": {"theta": -1}}, "theta"),
    ({"repetition_penalty": 1.2}, "repetition_penalty"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"frequency_penalty": -1}, "frequency_penalty"),
    ({"frequency_penalty": "x"}, "frequency_penalty"),
    ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"min_tokens": 4}, "min_tokens"),
    ({"bad_words": ["x"]}, "bad_words"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"structured_outputs": {"regex": "a+"}}, "structured_outputs"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"n": 2}, "n=2"),
    ({"use_beam_search": True}, "use_beam_search"),
    ({"logprobs": 0}, "logprobs"),  # completions: the chosen token's log-prob
    ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"prompt_logprobs": 1}, "prompt_logprobs"),
    ({"max_tokens": "many"}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 10**12}, "max_tokens"),
    ({"max_completion_tokens": 2.5}, "max_completion_tokens"),
    ({"vllm_xargs": {"prove_method": "asd"}}, "method=asd"),
]


@pytest.mark.parametrize("update,field", BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD)])
def test_every_control_the_rule_would_ignore_is_refused_naming_its_field(update, field):
    """A control accepted and silently ignored (the sampler scores raw logits greedily) fails here, as does a
    non-number that would reach float() (a 500 before) or a reason that does not name the field."""
    why = check_request("prove", {**OK, **update}, max_model_len=512)
    assert why is not None and field in why and "\n" not in why, why


def test_neutral_values_and_harmless_fields_pass():
    """What clients send by default (OpenAI's zeros, empty objects, text format) is not refused: a gate that refuses
    ``"presence_penalty": 0`` or ``"n": 1`` fails here."""
    body = {
        **OK, "presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1, "n": 1, "logit_bias": {},
        "bad_words": [], "logprobs": False, "top_logprobs": 0, "min_tokens": 0, "response_format": {"type": "text"},
        "tool_choice": "auto", "top_p": 0.3, "top_k": 5, "stream": True, "stop": ["\n"], "seed": 3,
        "max_tokens": 512, "max_completion_tokens": 12, "allowed_token_ids": [1, 2], "user": "u",
    }  # fmt: skip
    assert check_request("prove", body, max_model_len=512) is None
    assert check_request("prove", {"temperature": 0.0}) is None  # defaults everywhere
    assert "JSON object" in check_request("prove", [1, 2])


def test_every_field_of_vllms_request_models_is_classified():
    """vLLM 0.32's completions and chat completions request fields are each either passed (harmless to our rule) or
    checked: a vLLM that adds a control (a new penalty) fails here, not silently on the server."""
    pytest.importorskip("vllm")
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    known = gate.PASSED_FIELDS | set(gate._NEUTRAL)
    fields = set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
    assert fields - known == set()
    assert set(gate._NEUTRAL) <= fields  # no stale names


def _call(method: str, verb: str, path: str, body=None, max_model_len: int | None = 64):
    """One request through the middleware (an ASGI ``http`` middleware as vLLM registers it): (status, message),
    status 200 when it reached the app."""
    from starlette.requests import Request

    raw = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    scope = {"type": "http", "method": verb, "path": path, "headers": [], "query_string": b""}
    scope["app"] = SimpleNamespace(
        state=SimpleNamespace(
            vllm_config=SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_model_len))
        )
    )

    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}

    async def reached(request):
        return SimpleNamespace(status_code=200, body=b'{"message": "reached"}')

    check = getattr(gate, f"check_{method}_requests")
    response = asyncio.run(check(Request(scope, receive), reached))
    return response.status_code, json.loads(response.body)["message"]


GENERATING = [
    "/v1/responses", "/v1/messages", "/v1/chat/completions/batch", "/inference/v1/generate", "/invocations",
    "/cohere/v2/chat", "/generative_scoring", "/v1/audio/transcriptions", "/v1/completions/", "/pooling",
    "/v1/some/future/endpoint",
]  # fmt: skip


@pytest.mark.parametrize("path", GENERATING)
def test_the_middleware_is_default_deny(path):
    """A POST to any path it does not check gets a 4xx naming what it serves (before, only the two checked paths were
    looked at, and /v1/responses at temperature 0.7 reached the sampler's raise and killed the engine)."""
    status, why = _call("asd", "POST", path, {"input": "hi", "temperature": 0.7})
    assert status == 404 and path in why and all(p in why for p in SERVED_PATHS), why


def test_the_middleware_checks_served_paths_and_lets_reads_through():
    for path in SERVED_PATHS:
        assert _call("nsd", "POST", path, {"temperature": 0, "prompt": "x"}) == (200, "reached")
        status, why = _call("nsd", "POST", path, {"temperature": "0.0", "prompt": "x"})
        assert status == 400 and "temperature" in why
        status, why = _call("nsd", "POST", path, {"temperature": 0, "max_tokens": 65})
        assert (
            status == 400 and "max_tokens=65" in why and "max_model_len=64" in why
        )  # the server's own limit
        status, why = _call("nsd", "POST", path, b"{not json")
        assert status == 400 and "not valid JSON" in why
    for verb, path in (("GET", "/health"), ("GET", "/v1/models"), ("POST", "/tokenize"), ("GET", "/metrics")):
        assert _call("prove", verb, path)[0] == 200, path


# -- the sampler: one request's failure ends that request only ----------------------------------------------------


def _sampler(method: str, settings: dict, requests: dict):
    """A ``RuleSampler`` over a stand-in model runner (the fields it reads), built without vLLM's engine."""
    pytest.importorskip("vllm")
    from prove.decode.vllm.sampler import RULES, RuleSampler

    sampler = RuleSampler.__new__(RuleSampler)
    torch.nn.Module.__init__(sampler)
    runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=list(requests)), requests=requests)
    sampler.settings, sampler.method, sampler.runner, sampler.drafter = (
        {"method": method, **settings},
        method,
        runner,
        None,
    )
    sampler.params, sampler.state, sampler.failed, sampler.rule = {}, {}, {}, RULES[method]
    return sampler


def _state(**kw):
    from vllm import SamplingParams

    return SimpleNamespace(sampling_params=SamplingParams(max_tokens=32, **kw), output_token_ids=[])


def _step(sampler, drafts: list[list[int]], logits: torch.Tensor):
    """One engine step's call: ``drafts`` per request, ``logits`` (Σ(n+1), V) request-major (drafts then bonus)."""
    counts = [len(d) for d in drafts]
    target, bonus, row = [], [], 0
    for n in counts:
        target += range(row, row + n)
        bonus.append(row + n)
        row += n + 1
    metadata = SimpleNamespace(
        target_logits_indices=torch.tensor(target), bonus_logits_indices=torch.tensor(bonus),
        num_draft_tokens=counts, draft_token_ids=torch.tensor([t for d in drafts for t in d]),
        max_spec_len=max(counts),
    )  # fmt: skip
    out = sampler.forward(metadata, None, logits, SimpleNamespace(allowed_token_ids_mask=None))
    return [[t for t in r if t >= 0] for r in out.sampled_token_ids.tolist()]


def test_the_sampler_never_raises_it_ends_the_bad_request_alone():
    """A sampling request and one with bad extra arguments that slipped past every gate, beside a good one: before,
    the step raised (and the engine died for every request in flight); now the good row is what it is alone, the bad
    ones end on their stop token (or, with none, take the target's greedy token), each logged once."""
    torch.manual_seed(0)
    logits = torch.randn(9, 20)
    good = {"temperature": 0.0, "extra_args": {"theta": 0.3}}
    requests = {
        "good": _state(**good),
        "hot": _state(temperature=0.8, stop_token_ids=[13]),
        "badargs": _state(temperature=0.0, extra_args={"theta": "x"}),
    }
    sampler = _sampler("nsd", {"theta": 0.9}, requests)
    rows = _step(sampler, [[3, 4], [5, 6], [7, 8]], logits)
    alone = _sampler("nsd", {"theta": 0.9}, {"good": _state(**good)})
    assert rows[0] == _step(alone, [[3, 4]], logits[:3])[0]
    assert rows[1] == [13]
    assert rows[2] == [int(logits[6].argmax())]  # the target's token after the last committed one
    assert set(sampler.failed) == {"hot", "badargs"} and "greedy" in sampler.failed["hot"]
    assert "vllm_xargs.theta" in sampler.failed["badargs"]
    del requests["hot"], requests["badargs"]  # finished: forgotten
    sampler.runner.input_batch.req_ids = ["good"]
    _step(sampler, [[3, 4]], logits[:3])
    assert sampler.failed == {}


def test_a_drafted_primary_eos_ends_a_draft_models_block():
    """vLLM keeps a server request's primary EOS out of ``stop_token_ids`` (in ``eos_token_id``); the block ends at
    it, as our engine's does. Under ignore_eos it does not: reading ``all_stop_token_ids`` (vLLM adds the tokenizer's
    EOS there even then) or ``stop_token_ids`` alone fails here."""
    sampler = _sampler("asd", {"budget": 8.0, "gate": 0.25, "max_mismatches": 2}, {})
    server = _state(temperature=0.0)
    server.sampling_params.update_from_generation_config({}, eos_token_id=7)
    assert server.sampling_params.stop_token_ids == []
    assert sampler._cut(server, [3, 7, 4, 5]) == 2
    ignoring = _state(temperature=0.0, ignore_eos=True, stop_token_ids=[9])
    ignoring.sampling_params.update_from_generation_config({}, eos_token_id=7)
    assert 7 in ignoring.sampling_params.all_stop_token_ids
    assert sampler._cut(ignoring, [3, 7, 4, 5]) == 4
    assert sampler._cut(ignoring, [3, 7, 9, 5]) == 3


def test_async_scheduling_is_off_for_plugin_methods(checkpoints):
    """vLLM's GPU build turns async scheduling on for draft models; a plugin engine turns it off, refuses a user's
    ``async_scheduling``, and the plugin refuses to install on an engine that has it (a plain ``ar`` is untouched)."""
    from prove.decode.vllm.backend import VllmDecoder
    from prove.decode.vllm.serve import ServeConfig, server_argv

    mars, verifier = checkpoints["mars"], checkpoints["verifier"]
    dec = VllmDecoder(mars, method="prove", verifier=verifier, start=False)
    assert dec.engine_args["async_scheduling"] is False
    assert "async_scheduling" not in VllmDecoder(mars, method="ar", start=False).engine_args
    argv, _ = server_argv(ServeConfig(model=mars, verifier=verifier, method="prove"))
    assert "--no-async-scheduling" in argv
    from prove.decode.config import VllmOptions

    with pytest.raises(ValueError, match="async_scheduling=False .* drop vllm.engine_args.async_scheduling"):
        VllmDecoder(
            mars, method="prove", verifier=verifier, start=False,
            options=VllmOptions(engine_args={"async_scheduling": True}),
        )  # fmt: skip
    pytest.importorskip("vllm")
    config = SimpleNamespace(
        additional_config={vllm_plugin.CONFIG_KEY: {"method": "prove", "theta": 0.1}},
        scheduler_config=SimpleNamespace(async_scheduling=True),
    )
    with pytest.raises(ValueError, match="needs async_scheduling=False"):
        vllm_plugin.install_rule(SimpleNamespace(vllm_config=config))
