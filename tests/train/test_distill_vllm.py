"""Stage distill's generation on vLLM (``distill.backend=vllm``): the generated set is our engine's token for token
(prove-lossless as vLLM parallel drafting, the top-k read off the generating pass), a killed generation resumes
keeping what was written, and each data-parallel rank answers its own slice.

vLLM's CPU attention takes head sizes 32, 64, 80, ... (the suite's other models have 8 and 16), so the proposer here
has a head size of 32, and rows past the tokenizer that neither backend may output. An engine takes 25-50 s to
start on a 2-core CPU: one is built for the module (through the stage's own loader) and shared.
"""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("vllm", reason="distill.backend=vllm needs vLLM (`make install` installs it)")

from prove.train import distill, distill_vllm  # noqa: E402
from prove.train.distill import build_generated_set, generate_responses, read_shards  # noqa: E402

from tests.train.helpers import tiny_overrides, train_config, write_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow

N_PROMPTS, NEW, TOP_K = 10, 12, 4
SPARE_ROWS = 12
KNOBS = {"distill.vllm.kv_cache_gb": 0.25, "distill.vllm.max_model_len": 512, "distill.vllm.max_num_seqs": 8}


@pytest.fixture(scope="module")
def proposer(tmp_path_factory, qwen2_factory, tokenizer, arithmetic_jsonl):
    """A random block checkpoint (K = 4): the identities hold for any weights. It also ends on a token its first
    response writes mid-way (a random model seldom emits its EOS), so some responses end on an EOS id and some at
    the limit."""
    from prove.decode import Decoder

    kw = dict(layers=2, hidden=64, heads=2, kv_heads=1, intermediate=128, init_std=0.3)  # head size 32
    model = qwen2_factory(len(tokenizer) + SPARE_ROWS, seed=5, eos_token_id=tokenizer.eos_token_id, **kw)
    root = tmp_path_factory.mktemp("vllm-distill")
    path = write_checkpoint(root / "mars", model, tokenizer, block_size=4)
    (first, *_), _ = distill.prompt_set(_cfg(root, arithmetic_jsonl, path, "engine"))
    stop = Decoder(str(path), method="ar").generate(first.messages, max_new_tokens=NEW).token_ids[NEW // 2]
    gen = json.loads((path / "generation_config.json").read_text())
    gen["eos_token_id"] = [tokenizer.eos_token_id, stop]
    (path / "generation_config.json").write_text(json.dumps(gen))
    return path


def _cfg(run_dir, data, proposer, backend: str, **kw):
    base = {
        "stage": "distill",
        "distill.train": False,
        "distill.proposer": str(proposer),
        "distill.num_prompts": N_PROMPTS,
        "distill.max_new_tokens": NEW,
        "distill.top_k": TOP_K,
        "distill.backend": backend,
        **KNOBS,
    }
    base.update(kw)
    return train_config(tiny_overrides(run_dir, data, **base))


@pytest.fixture(scope="module")
def engine(request, tmp_path_factory, arithmetic_jsonl, proposer):
    """The stage's vLLM proposer (``load_vllm_proposer``, prove-lossless with K = 4), built once."""
    cfg = _cfg(tmp_path_factory.mktemp("cfg"), arithmetic_jsonl, proposer, "vllm")
    dec = distill_vllm.load_vllm_proposer(cfg)
    request.addfinalizer(dec.close)
    assert dec.spec["parallel_drafting"] and dec.spec["num_speculative_tokens"] == 4
    assert dec.engine_args["kv_cache_memory_bytes"] == 2**28 and dec.engine_args["max_num_seqs"] == 8
    return dec


@pytest.fixture()
def shared(engine, monkeypatch):
    """Every generation of a test runs on the module's engine (the stage closes its own when done)."""
    monkeypatch.setattr(distill_vllm, "load_vllm_proposer", lambda cfg, gpus=(): engine)
    monkeypatch.setattr(engine, "close", lambda: None)
    return engine


@pytest.fixture(scope="module")
def engine_set(tmp_path_factory, arithmetic_jsonl, proposer):
    """The reference: our engine's prove-lossless, one request at a time, top-k by a teacher-forced pass."""
    cfg = _cfg(tmp_path_factory.mktemp("engine"), arithmetic_jsonl, proposer, "engine")
    return [dict(r) for r in build_generated_set(generate_responses(cfg, progress=False))]


def _assert_same_set(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want) == N_PROMPTS
    for a, b in zip(got, want, strict=True):
        same = ("index", "id", "messages", "prompt_ids", "response_ids", "finished", "topk_ids")
        assert {k: a[k] for k in same} == {k: b[k] for k in same}, a["index"]
        for x, y in zip(a["topk_logprobs"], b["topk_logprobs"], strict=True):
            assert all(math.isclose(u, v, abs_tol=1e-4) for u, v in zip(x, y, strict=True))


def test_the_vllm_generated_set_is_the_engines_token_for_token(
    shared, tmp_path, arithmetic_jsonl, proposer, engine_set
):
    out = generate_responses(_cfg(tmp_path, arithmetic_jsonl, proposer, "vllm"), progress=False)
    got = [dict(r) for r in build_generated_set(out)]
    _assert_same_set(got, engine_set)
    assert any(r["finished"] for r in got) and any(not r["finished"] for r in got)  # EOS and the limit
    assert max(r["tokens_per_cycle"] for r in got) > 1.0  # vLLM drafted (and verified) blocks
    settings = json.loads((out / "generation.json").read_text())
    assert settings["backend"] == "vllm" and "vLLM" in settings["top_k_source"]


def test_an_on_policy_relabelling_on_vllm_answers_only_the_unread_prompts(
    shared, tmp_path, arithmetic_jsonl, proposer, engine_set
):
    """A later round's relabelling (``distill.exclude_from``, as ``prove.train.rounds`` sets it) on the module's
    vLLM engine: the prompts an earlier set read are left out, the rest answered as our engine answers them, and
    generation.json records the set's own ids (fails if vLLM's path takes the prompts before the exclusion or the
    ids recorded are not the ones answered)."""
    earlier = tmp_path / "round-1"
    earlier.mkdir()
    (earlier / "generation.json").write_text(json.dumps({"prompt_ids": [r["id"] for r in engine_set[:4]]}))
    cfg = _cfg(
        tmp_path,
        arithmetic_jsonl,
        proposer,
        "vllm",
        **{"distill.num_prompts": N_PROMPTS - 4, "distill.exclude_from": f"[{earlier}]"},
    )
    out = generate_responses(cfg, progress=False)
    got = [dict(r) for r in build_generated_set(out)]
    same = ("id", "prompt_ids", "response_ids", "finished")
    assert [{k: r[k] for k in same} for r in got] == [{k: r[k] for k in same} for r in engine_set[4:]]
    settings = json.loads((out / "generation.json").read_text())
    assert settings["prompt_ids"] == [r["id"] for r in engine_set[4:]]
    assert settings["exclude_from"] == [str(earlier)]


def test_a_killed_vllm_generation_resumes_keeping_what_was_written(
    shared, tmp_path, arithmetic_jsonl, proposer, engine_set
):
    cfg = _cfg(tmp_path, arithmetic_jsonl, proposer, "vllm")
    written = []

    def crash_after_three(rec):
        written.append(rec["index"])
        if len(written) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        generate_responses(cfg, progress=False, on_record=crash_after_three)
    assert not shared.llm.llm_engine.has_unfinished_requests()  # the rest were aborted: the engine is idle
    shard = tmp_path / "distill-data" / "shards" / "part-00000.jsonl"
    kept = read_shards(shard.parent)
    assert sorted(kept) == sorted(written)
    with shard.open("a") as f:  # killed while writing the next record
        f.write('{"index": 7, "id": "x", "messages": [')
    seen = []
    generate_responses(cfg, progress=False, on_record=lambda r: seen.append(r["index"]))
    assert sorted(seen) == sorted(set(range(N_PROMPTS)) - set(written))  # only what was missing
    again = read_shards(shard.parent)
    assert {i: kept[i] for i in written} == {i: again[i] for i in written}  # kept as written
    _assert_same_set([dict(r) for r in build_generated_set(shard.parent.parent)], engine_set)


def test_each_data_parallel_rank_answers_its_own_slice(
    shared, tmp_path, arithmetic_jsonl, proposer, engine_set
):
    """Two ranks (the launcher's; run one after the other here, on one engine): rank r answers prompts i ≡ r (mod 2)
    into its own shard, and the assembled set is the one-process set."""
    cfg = _cfg(tmp_path, arithmetic_jsonl, proposer, "vllm")
    for rank in (0, 1):
        generate_responses(cfg, rank=rank, world_size=2, progress=False)
    shards = tmp_path / "distill-data" / "shards"
    for rank in (0, 1):
        rows = [json.loads(x) for x in (shards / f"part-{rank:05d}.jsonl").read_text().splitlines()]
        assert sorted(r["index"] for r in rows) == list(range(rank, N_PROMPTS, 2))
    _assert_same_set([dict(r) for r in build_generated_set(shards.parent)], engine_set)


def test_the_smollm2_recipes_self_distillation_on_vllm_from_a_gguf_file(
    tmp_path, stock_tokenizer, monkeypatch
):
    """recipes/smollm2-135m.yaml's step 1 as written (backend=vllm, ar) on a tiny Llama read from a GGUF file:
    vLLM loads the folder the file converts to, the one our engine loads, and answers with its greedy tokens."""
    pytest.importorskip("gguf")
    from prove.data import gguf
    from prove.data.synthetic import main as write_tasks
    from prove.decode import Decoder

    from tests.gguf_helpers import tiny_llama, write_tiny_gguf

    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path / "cache"))
    llama = tiny_llama(stock_tokenizer, hidden=64, heads=2, kv_heads=1, intermediate=128)  # head size 32
    base = write_tiny_gguf(tmp_path / "base.gguf", llama, stock_tokenizer)
    write_tasks(["--out", str(tmp_path / "data"), "--n", "16", "--test-size", "2", "--tasks", "arithmetic,lists", "--instruct"])  # fmt: skip
    cfg = train_config(
        [
            "recipe=smollm2-135m", "stage=distill", "stage.role=proposer", "logger=none", f"run_dir={tmp_path / 'run'}",
            f"model.name_or_path={base}", f"stages.proposer.distill.data={tmp_path / 'data' / 'train.jsonl'}",
            "stages.proposer.distill.num_prompts=6", "distill.max_new_tokens=16", *(f"{k}={v}" for k, v in KNOBS.items()),
        ]
    )  # fmt: skip
    assert cfg.distill.backend == "vllm" and cfg.distill.method == "ar" and cfg.distill.proposer == str(base)
    out = generate_responses(cfg, progress=False, rank=0, world_size=1)
    rows = [dict(r) for r in build_generated_set(out)]
    ours = Decoder(str(base), method="ar")
    assert len(rows) == 6
    for row in rows:
        prompt = row["messages"][:-1]
        assert row["prompt_ids"] == ours.encode(prompt)
        assert row["response_ids"] == ours.generate(prompt, max_new_tokens=16).token_ids
