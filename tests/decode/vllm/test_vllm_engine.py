"""``backend=vllm`` against our engine on tiny random models (fp32): vLLM's prove-lossless (the checkpoint drafting
for itself by parallel drafting), greedy sd, pard and ar give our ``ar``'s tokens, one request in flight and all at
once; sampling keeps the target's distribution; stop strings and EOS end where ours end; ``prove-decode
backend=vllm`` writes our records; ``prove-serve`` answers ``/v1/completions`` with them.

vLLM's CPU attention takes head sizes 32, 64, 80, ... (the suite's other models have 8 and 16), so these models
have a head size of 32, and a few rows past the tokenizer that vLLM must never output. An engine takes 25-50 s to
start on a 2-core CPU: each is built once per module and shared.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="backend=vllm needs vLLM (`make install` installs it)")

from prove.common.checkpoint import config_mask_id  # noqa: E402
from prove.decode import Decoder  # noqa: E402
from prove.decode.config import DecodeParams, VllmOptions  # noqa: E402
from prove.decode.vllm.backend import VllmDecoder  # noqa: E402

from tests.decode.conftest import save_checkpoint  # noqa: E402
from tests.decode.test_draft import perturbed  # noqa: E402

pytestmark = pytest.mark.slow

N = 24
SPARE_ROWS = 12
"""Embedding rows past the tokenizer (real checkpoints pad their vocabulary too): never to be output."""
OPTIONS = VllmOptions(max_num_seqs=16, kv_cache_gb=0.25, max_model_len=512)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, qwen2_factory, tokenizer):
    """``mars``: the target, block checkpoint of K = 4 (random weights: the identities hold for any); ``draft``: a
    perturbed copy as an AR draft; ``pard``: another perturbed copy as a small block drafter."""
    root = tmp_path_factory.mktemp("vllm")
    kw = dict(layers=2, hidden=64, heads=2, kv_heads=1, intermediate=128, init_std=0.3)
    kw.update(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    target = qwen2_factory(len(tokenizer) + SPARE_ROWS, seed=11, **kw)  # head size 64 / 2 = 32
    return {
        "mars": save_checkpoint(root / "mars", target, tokenizer),
        "draft": save_checkpoint(root / "draft", perturbed(target, 0.05, seed=3), tokenizer, stage="sft"),
        "pard": save_checkpoint(root / "pard", perturbed(target, 0.05, seed=4), tokenizer),
    }


@pytest.fixture(scope="module")
def ours(ckpts, prompts):
    """Our engine's ``ar`` on the target: the reference of every greedy row."""
    dec = Decoder(ckpts["mars"], method="ar")
    return [dec.generate(p, max_new_tokens=N).token_ids for p in prompts]


def _engine(request, model, **kw) -> VllmDecoder:
    dec = VllmDecoder(model, options=OPTIONS, **kw)
    request.addfinalizer(dec.close)
    return dec


@pytest.fixture(scope="module")
def lossless(request, ckpts):
    """The default start-up path: no ``kv_cache_gb``, so prove sizes the KV cache from the free memory
    (``prove.decode.vllm.memory``) — here the 16 sequences of 512 tokens of the target and its self-drafter."""
    options = dataclasses.replace(OPTIONS, kv_cache_gb=None)
    dec = VllmDecoder(ckpts["mars"], method="prove-lossless", options=options)
    request.addfinalizer(dec.close)
    return dec


def test_the_default_start_up_gets_an_explicit_kv_cache_sized_for_its_sequences(lossless, ckpts):
    from prove.decode.vllm.memory import footprint
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(ckpts["mars"])
    fp = footprint([(ckpts["mars"], config)] * 2, dtype="float32", max_model_len=512, max_num_seqs=16)
    # vLLM's own CPU default (no kv_cache_memory_bytes) would have demanded 92% of the machine free
    assert lossless.engine_args["kv_cache_memory_bytes"] == fp.max_kv_bytes
    assert "gpu_memory_utilization" not in lossless.engine_args


@pytest.fixture(scope="module")
def vllm_ar(request, ckpts):
    return _engine(request, ckpts["mars"], method="ar")


def _all(dec: VllmDecoder, prompts, **kw):
    """Every prompt's result, by prompt index (vLLM hands them back as they finish)."""
    return dict(dec.generate_many(prompts, N, **kw))


def test_the_block_checkpoint_is_a_vllm_parallel_drafter(ckpts, tokenizer):
    assert config_mask_id(ckpts["mars"]) == tokenizer.convert_tokens_to_ids("<|mask|>")


@pytest.mark.parametrize("concurrency", [1, None], ids=["one-in-flight", "all-at-once"])
def test_vllm_prove_lossless_equals_vllm_ar_equals_our_ar(lossless, vllm_ar, prompts, ours, concurrency):
    pl = _all(lossless, prompts, concurrency=concurrency)
    ar = _all(vllm_ar, prompts, concurrency=concurrency)
    for i, want in enumerate(ours):
        assert pl[i].token_ids == ar[i].token_ids == want, i
        s = pl[i].stats
        assert s.new_tokens == len(want) == sum(s.committed_per_cycle)
        # y_1 of a self-draft is the target's own next token, accepted unless it is an id the target may not output
        # (a random model's spare row or <|mask|>: vLLM restricts the verifier's tokens, not the drafter's)
        assert s.proposed_by_depth[0] >= s.accepted_by_depth[0] > 0
        assert s.drafts > 0 and s.mean_acceptance_length > 1.0 and s.cycles < len(want)
        assert ar[i].stats.cycles == len(want) and ar[i].stats.drafts == 0
        assert pl[i].text == lossless.tokenizer.decode(want, skip_special_tokens=True)


def test_stop_strings_and_eos_end_where_ours_end(lossless, ckpts, ours, prompts, tokenizer):
    i = max(range(len(ours)), key=lambda j: len(ours[j]))
    text = tokenizer.decode(ours[i], skip_special_tokens=False)
    # two printable characters from mid-output (possibly inside a verified block); not a byte a random model emitted
    # alone, which a whole-text decode shows as U+FFFD and vLLM's incremental one holds back
    j = next(
        j
        for j in range(len(text) // 2, len(text) - 1)
        if text[j : j + 2].isascii() and text[j : j + 2].isprintable()
    )
    stop = text[j : j + 2]
    engine = Decoder(ckpts["mars"], method="prove-lossless")
    want = engine.generate(prompts[i], max_new_tokens=N, stop=[stop]).token_ids
    assert len(want) < len(ours[i])
    ((_, got),) = lossless.generate_many([prompts[i]], N, stop=[stop])
    assert got.token_ids == want
    eos = ours[i][len(ours[i]) // 3]  # an EOS id of our choosing, met a third of the way in
    want = engine.generate(prompts[i], max_new_tokens=N, eos_token_id=eos).token_ids
    ((_, got),) = lossless.generate_many([prompts[i]], N, eos_token_id=eos)
    assert got.token_ids == want and got.token_ids[-1] == eos


def test_prove_decode_backend_vllm_writes_our_records(lossless, ckpts, tokenizer, tmp_path, monkeypatch):
    """``prove-decode backend=vllm`` (``prompts.run``): the same record per prompt as backend=engine, resumed alike;
    the engine is the shared one (its arguments are checked to be what the CLI asked for)."""
    from prove.decode import records as prompt_runs
    from prove.decode.config import DecodeConfig
    from prove.decode.vllm import backend as vllm_backend

    lines = ["Ana has 3 apples", {"messages": [{"role": "user", "content": "Cleo has 4 pens."}]}, "7"]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(x if isinstance(x, dict) else {"prompt": x}) + "\n" for x in lines))
    seen = {}

    class Shared:
        def __new__(cls, model, **kw):
            seen.update(kw, model=model)
            return lossless

    monkeypatch.setattr(vllm_backend, "VllmDecoder", Shared)
    monkeypatch.setattr(lossless, "close", lambda: None)
    common = dict(model=ckpts["mars"], prompts=str(path), max_new_tokens=N, method="prove-lossless")
    prompt_runs.run(DecodeConfig(**common, output=str(tmp_path / "engine.jsonl")))
    cfg = DecodeConfig(**common, output=str(tmp_path / "vllm.jsonl"), backend="vllm")
    cfg.vllm.concurrency = 2
    prompt_runs.run(cfg)
    assert (
        seen["model"] == ckpts["mars"]
        and seen["method"] == "prove-lossless"
        and seen["options"].concurrency == 2
    )
    read = lambda name: {r["id"]: r for r in map(json.loads, (tmp_path / name).read_text().splitlines())}  # noqa: E731
    mine, theirs = read("engine.jsonl"), read("vllm.jsonl")
    assert mine.keys() == theirs.keys() and len(mine) == 3
    for key, row in theirs.items():
        assert {k: row[k] for k in ("prompt", "completion", "token_ids", "method")} == {
            k: mine[key][k] for k in ("prompt", "completion", "token_ids", "method")
        }
        assert row["stats"]["backend"] == "vllm" and row["stats"]["new_tokens"] == len(row["token_ids"])
    prompt_runs.run(cfg)  # resumed: every prompt finished, nothing appended
    assert len((tmp_path / "vllm.jsonl").read_text().splitlines()) == 3


@pytest.fixture(scope="module")
def sd(request, ckpts):
    return _engine(request, ckpts["mars"], method="sd", draft=ckpts["draft"], k=3)


def test_vllm_greedy_sd_and_pard_equal_our_ar(request, sd, ckpts, prompts, ours):
    pard = _engine(request, ckpts["mars"], method="pard", draft=ckpts["pard"])
    assert pard.spec["model"] == ckpts["pard"] and pard.spec["num_speculative_tokens"] == 4
    for dec in (sd, pard):
        for concurrency in (1, None):
            got = _all(dec, prompts, concurrency=concurrency)
            assert [got[i].token_ids for i in range(len(prompts))] == ours
    ours_pard = Decoder(ckpts["mars"], method="pard", draft=ckpts["pard"])  # our engine runs the same method
    assert [ours_pard.generate(p, max_new_tokens=N).token_ids for p in prompts] == ours


def _pair_probs(model_path: str, prompt: list[int], allowed: list[int], temperature: float) -> dict:
    """Exact P(y_1, y_2) of a model at ``temperature`` over the allowed ids (our engine's warping), pairs of
    probability above 1e-6."""
    from prove.decode.sampling import logits_to_probs
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    mask = torch.full((model.config.vocab_size,), float("-inf"))
    mask[allowed] = 0.0

    def dist(ids):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        return logits_to_probs(logits + mask, temperature)

    first = dist(prompt)
    pairs = {}
    for a in (first > 1e-6).nonzero()[:, 0].tolist():
        second = float(first[a]) * dist(prompt + [a])
        pairs.update({(a, b): float(q) for b, q in enumerate(second.tolist()) if q > 1e-6})
    return pairs


def _tv(p: dict, q: dict, bins: set) -> float:
    """Total variation between two distributions of pairs over ``bins``, every other pair pooled in one bin (the
    hundreds of pairs below 1% would otherwise make the sampling noise as large as the test's margin)."""

    def pooled(d: dict) -> dict:
        out = {k: d.get(k, 0.0) for k in bins}
        out["rest"] = sum(v for k, v in d.items() if k not in bins)
        return out

    a, b = pooled(p), pooled(q)
    return 0.5 * sum(abs(a[k] - b[k]) for k in a)


def test_vllm_sampling_keeps_the_targets_distribution(vllm_ar, sd, ckpts, prompts):
    """Sampling on vLLM (``ar``): the (y_1, y_2) pairs of 2,000 seeded requests at temperature 0.5 follow the
    target's distribution over the allowed ids within sampling noise (about 0.02 here), while another model's
    (the draft's) lies well apart. Speculative sampling is refused on vLLM's CPU build, whose rejection sampler does
    not keep the distribution (``check_sampling``); greedy sd is checked above."""
    n, temperature = 2000, 0.5
    prompt = prompts[0]
    target = _pair_probs(ckpts["mars"], prompt, vllm_ar.allowed, temperature)
    draft = _pair_probs(ckpts["draft"], prompt, vllm_ar.allowed, temperature)
    sampling = DecodeParams(temperature=temperature)
    counts: dict = {}
    for _, out in vllm_ar.generate_many([prompt] * n, 2, eos_token_id=[], seeds=range(n), sampling=sampling):
        key = tuple(out.token_ids)
        counts[key] = counts.get(key, 0) + 1
    empirical = {k: c / n for k, c in counts.items()}
    bins = {k for k, v in target.items() if v >= 0.01}
    sampled, other = _tv(empirical, target, bins), _tv(draft, target, bins)
    assert sampled < 0.06 and other > 0.2, (sampled, other)  # the draft's distribution would fail it
    with pytest.raises(ValueError, match="speculative sampling does not keep the target's distribution"):
        next(sd.generate_many([prompt], 2, sampling=sampling))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def serving(args: list[str]):
    """``prove-serve`` with ``args`` on a free local port: yields (base URL, a dict that gets the server's output
    and exit status once it has stopped on SIGINT)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "prove.decode.vllm.serve", *args, f"port={port}"]
    server = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ
    )
    done: dict = {}
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 240
        while True:
            assert server.poll() is None, server.stdout.read()
            try:
                with urllib.request.urlopen(base + "/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "prove-serve did not come up in 240 s"
                time.sleep(1)
        yield base, done
    finally:
        server.send_signal(signal.SIGINT)
        try:
            done["code"] = server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
        done["out"] = server.stdout.read()


def test_prove_serve_answers_completions_with_our_ar_tokens(ckpts, prompts, ours, lossless):
    """``prove-serve`` on a free local port (prove-lossless: the server drafts as vLLM's own did above) answers
    ``/v1/completions`` with our ``ar``'s tokens at temperature 0, then stops cleanly on SIGINT."""
    args = [f"model={ckpts['mars']}", "method=prove-lossless", "max_num_seqs=8", "max_model_len=512"]
    with serving(args) as (base, done):  # KV cache sized by prove (no kv_cache_gb)
        for p, want in zip(prompts, ours, strict=True):
            body = {"model": ckpts["mars"], "prompt": p, "max_tokens": N, "temperature": 0.0}
            body.update(return_token_ids=True, allowed_token_ids=lossless.allowed, skip_special_tokens=False)
            body.update(stop_token_ids=lossless.eos_ids(), ignore_eos=True)
            choice = _post(base + "/v1/completions", body)["choices"][0]
            assert choice["token_ids"] == want
    out = done["out"]
    assert (
        "prove-serve: prove-lossless on vLLM at http://127.0.0.1:" in out
        and '"parallel_drafting": true' in out
    )
    assert done["code"] == 0, out[-3000:]
