"""A real ``prove-serve method=asd`` on localhost under load (one server for the module, tiny random fp32 models):
64 clients at once mix every generating endpoint vLLM 0.32 mounts, valid requests and bad ones; the server stays up,
every bad request gets a 4xx whose one line names its field (or, for a path it does not serve, the paths it does),
every valid one an answer. Then a drafted primary EOS (the tokenizer's own, which vLLM keeps out of
``stop_token_ids``) ends ASD's block on the server as it does on our engine.

Before the gate was default-deny, one ``/v1/responses`` request at temperature 0.7 reached the plugin sampler's
``raise`` and the engine died for every request in flight (docs/vllm.md, "The server's gate")."""

from __future__ import annotations

import concurrent.futures
import copy
import json
import urllib.error
import urllib.request

import pytest

pytest.importorskip("vllm", reason="backend=vllm needs vLLM (`make install` installs it)")

from prove.decode import Decoder  # noqa: E402
from prove.decode.vllm.backend import VllmDecoder  # noqa: E402

from tests.decode.conftest import save_checkpoint  # noqa: E402
from tests.decode.test_draft import perturbed  # noqa: E402
from tests.decode.vllm.test_vllm_engine import serving  # noqa: E402

pytestmark = pytest.mark.slow

K = 4
N = 16
SPARE_ROWS = 12
CLIENTS = 64


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, qwen2_factory, tokenizer, prompts):
    """``target`` and its perturbed AR ``draft``, saved with the tokenizer's EOS (and the configs') moved to a token
    ``eos`` found where the block cut matters: for prompt ``case`` at ASD gate ``gate``, our engine's answer with
    ``eos`` as EOS differs from its answer without it, cut after ``eos`` (ASD's suffix values count to the block's
    end, so a block cut at a drafted EOS gates the mismatches before it more tightly than a full block)."""
    root = tmp_path_factory.mktemp("vllm-load")
    kw = dict(layers=2, hidden=64, heads=2, kv_heads=1, intermediate=128, init_std=0.3)
    kw.update(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    target = qwen2_factory(len(tokenizer) + SPARE_ROWS, seed=11, **kw)
    draft = perturbed(target, 0.05, seed=3)
    first = save_checkpoint(root / "first", target, tokenizer)
    first_draft = save_checkpoint(root / "first-draft", draft, tokenizer, stage="sft")
    never = len(tokenizer) + SPARE_ROWS - 1  # a row no engine outputs: no EOS at all
    found = None
    for gate in (0.25, 0.5, 1.0, 2.0):
        asd = Decoder(first, method="asd", draft=first_draft, k=K, gate=gate)
        for i, p in enumerate(prompts):
            head = Decoder(first, method="ar").generate(p, max_new_tokens=1).token_ids  # vLLM's first token
            free = head + asd.generate(p + head, max_new_tokens=N - 1, eos_token_id=never).token_ids
            for j, t in enumerate(free):
                if j < 2 or t in free[:j] or t >= len(tokenizer):
                    continue
                cut = head + asd.generate(p + head, max_new_tokens=N - 1, eos_token_id=t).token_ids
                if cut != free[: j + 1]:
                    found = {"eos": t, "case": i, "gate": gate}
                    break
            if found:
                break
        if found:
            break
    assert found, "no EOS that the block cut moves: change the seeds"
    tok = copy.deepcopy(tokenizer)
    tok.eos_token = tok.convert_ids_to_tokens(found["eos"])
    assert tok.eos_token_id == found["eos"]
    out = dict(found)
    for name, model, stage in (("target", target, "mars"), ("draft", draft, "sft")):
        model = copy.deepcopy(model)
        model.config.eos_token_id = model.generation_config.eos_token_id = found["eos"]
        out[name] = save_checkpoint(root / name, model, tok, stage=stage)
    return out


@pytest.fixture(scope="module")
def server(ckpts):
    args = [
        f"model={ckpts['target']}", "method=asd", f"draft={ckpts['draft']}", f"k={K}", "max_num_seqs=16",
        "kv_cache_gb=0.25", "max_model_len=512",
    ]  # fmt: skip
    with serving(args) as (base, done):
        yield base, done
    out = done["out"]
    assert done["code"] == 0, out[-3000:]
    assert '"async_scheduling": false' in out  # the engine ran with it off
    served = out.split("[shutdown] API server: shutdown triggered")[
        0
    ]  # SIGINT's kill of the engine logs its own
    assert "EngineDeadError" not in served and "Traceback" not in served, served[-3000:]
    assert "ended by the plugin" not in served  # no request slipped past the gate to the sampler


def _send(base: str, path: str, body: dict) -> tuple[int, str]:
    """(HTTP status, body text) of one POST, errors included."""
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=90) as r:  # a valid 8-token answer takes seconds
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _requests(model: str, prompts) -> list[tuple[str, dict, str | None]]:
    """(path, body, None for a valid request, else the text its refusal must name)."""
    comp = {"model": model, "max_tokens": 8, "temperature": 0}
    chat = {**comp, "messages": [{"role": "user", "content": "Ana has 3 apples"}]}
    valid = [
        ("/v1/completions", {**comp, "prompt": prompts[0]}, None),
        ("/v1/completions", {**comp, "prompt": "How many coins", "vllm_xargs": {"budget": 2.0}}, None),
        ("/v1/completions", {**comp, "prompt": prompts[1], "stream": True}, None),
        ("/v1/chat/completions", chat, None),
        ("/v1/chat/completions", {**chat, "presence_penalty": 0, "n": 1, "max_completion_tokens": 6}, None),
    ]
    bad = [
        ("/v1/completions", {**comp, "prompt": prompts[2], "temperature": 0.7}, "temperature"),
        ("/v1/chat/completions", {**chat, "temperature": "warm"}, "temperature"),
        ("/v1/completions", {**comp, "prompt": "x", "vllm_xargs": {"nope": 1}}, "nope"),
        ("/v1/completions", {**comp, "prompt": "x", "vllm_xargs": ["budget"]}, "vllm_xargs"),
        ("/v1/chat/completions", {**chat, "vllm_xargs": {"gate": "wide"}}, "vllm_xargs.gate"),
        ("/v1/completions", {**comp, "prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
        ("/v1/chat/completions", {**chat, "repetition_penalty": 1.3}, "repetition_penalty"),
        ("/v1/chat/completions", {**chat, "frequency_penalty": "x"}, "frequency_penalty"),
        ("/v1/completions", {**comp, "prompt": "x", "max_tokens": 10**9}, "max_tokens"),
        ("/v1/completions", {**comp, "prompt": "x", "max_tokens": "lots"}, "max_tokens"),
        ("/v1/chat/completions", {**chat, "logit_bias": {"5": 50}}, "logit_bias"),
        ("/v1/chat/completions", {**chat, "n": 3}, "n=3"),
        ("/v1/chat/completions", {**chat, "response_format": {"type": "json_object"}}, "response_format"),
        ("/v1/completions", {**comp, "prompt": "x", "min_tokens": 5}, "min_tokens"),
    ]
    unserved = [
        ("/v1/responses", {"model": model, "input": "hi", "temperature": 0.7}, "/v1/responses"),
        ("/v1/messages", {"model": model, "max_tokens": 8, "messages": chat["messages"]}, "/v1/messages"),
        ("/v1/chat/completions/batch", {**chat, "temperature": 0.7}, "/v1/chat/completions/batch"),
        ("/inference/v1/generate", {"model": model, "token_ids": prompts[0]}, "/inference/v1/generate"),
        ("/invocations", {**chat, "temperature": 0.7}, "/invocations"),
    ]
    return valid + bad + unserved


def test_the_server_stays_up_under_64_clients_mixing_valid_and_bad_requests(server, ckpts, prompts):
    """A gate that lets one bad request through to the engine (the old raise in the sampler, or a float() of a
    string) fails here: the server dies or answers 500, and the valid requests sent beside it go unanswered (checked:
    with the plugin module as it was before, this test fails, its requests timing out on a dead engine)."""
    base, _ = server
    mix = _requests(ckpts["target"], prompts)
    jobs = [mix[i % len(mix)] for i in range(3 * CLIENTS)]
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(lambda job: _send(base, job[0], job[1]), jobs))
    for (path, body, field), (status, text) in zip(jobs, results, strict=True):
        if field is None:
            assert status == 200, (path, body, text[:500])
            if body.get("stream"):
                assert "data: [DONE]" in text
            else:
                choice = json.loads(text)["choices"][0]
                assert choice["finish_reason"] in ("length", "stop"), choice
        else:
            message = json.loads(text)["error"]["message"]
            assert status == (404 if path.startswith(field) else 400), (path, body, status, text[:500])
            assert field in message and "\n" not in message, (path, body, message)
            if status == 404:
                assert "/v1/completions" in message and "/v1/chat/completions" in message
    with urllib.request.urlopen(base + "/health", timeout=30) as r:
        assert r.status == 200
    status, text = _send(base, "/v1/completions", mix[0][1])  # still serving
    assert status == 200 and json.loads(text)["choices"][0]["text"] is not None


def test_a_drafted_primary_eos_ends_the_block_as_on_our_engine(server, ckpts, prompts):
    """No ``stop_token_ids`` and no ``ignore_eos`` in the request (what a plain client sends): vLLM keeps the
    tokenizer's EOS in ``eos_token_id`` only, and the plugin's block cut must read it there, as our engine's EOS
    ends ASD's block; the answer is vLLM's first token (the target's greedy one), then our engine's ASD for the prompt
    extended by it. On prompt ``case`` at its gate the cut changes the answer (the fixture found it so): a plugin that
    reads ``stop_token_ids`` alone answers there what our engine answers with no EOS, cut after it, and fails.
    (Checked: it does.)"""
    base, _ = server
    plan = VllmDecoder(ckpts["target"], method="asd", draft=ckpts["draft"], k=K, start=False)
    gate = ckpts["gate"]
    ours = Decoder(ckpts["target"], method="asd", draft=ckpts["draft"], k=K, gate=gate)
    for i, p in enumerate(prompts):
        body = {"model": ckpts["target"], "prompt": p, "max_tokens": N, "temperature": 0}
        body.update(return_token_ids=True, allowed_token_ids=plan.allowed, skip_special_tokens=False)
        body["vllm_xargs"] = {"gate": gate}
        status, text = _send(base, "/v1/completions", body)
        assert status == 200, text[:500]
        got = json.loads(text)["choices"][0]["token_ids"]
        want = got[:1] + ours.generate(list(p) + got[:1], max_new_tokens=N - 1).token_ids
        assert got == want, (i, got, want)
