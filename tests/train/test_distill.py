"""Stage distill (docs/design.md §2.3): the loss against a hand computation, the generated set (exact greedy output,
top-k aligned, resumable), the verifier's training rows, and the stage end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from prove.train.collate import DistillCollator
from prove.train.config import Role, Stage
from prove.train.distill import build_generated_set, generate_responses, read_shards, training_rows
from prove.train.losses import distill_loss

from tests.train.helpers import losses, tiny_overrides, torchrun, train_config, write_checkpoint

# -- the loss ----------------------------------------------------------------------------------------------------


def _hand_loss(logits, labels, topk_ids, topk_logprobs, kl_weight):
    """Loops over every position: CE = mean of −log q(y); KL = mean of Σ_i p̂_i (log p̂_i − log q_i)."""
    ce_terms, kl_terms = [], []
    for b in range(labels.shape[0]):
        for t in range(1, labels.shape[1]):
            y = int(labels[b, t])
            if y == -100:
                continue
            z = [float(v) for v in logits[b, t - 1]]
            lse = math.log(sum(math.exp(v) for v in z))
            ce_terms.append(lse - z[y])
            lp = [float(v) for v in topk_logprobs[b, t]]
            norm = math.log(sum(math.exp(v) for v in lp))
            kl = 0.0
            for i, tok in enumerate(topk_ids[b, t].tolist()):
                p_hat = math.exp(lp[i] - norm)
                kl += p_hat * ((lp[i] - norm) - (z[tok] - lse))
            kl_terms.append(kl)
    ce, kl = sum(ce_terms) / len(ce_terms), sum(kl_terms) / len(kl_terms)
    return ce + kl_weight * kl, ce, kl


def test_distill_loss_matches_a_hand_computation():
    g = torch.Generator().manual_seed(0)
    bsz, length, vocab, k = 2, 5, 7, 3
    logits = torch.randn(bsz, length, vocab, generator=g)  # (B, L, V)
    labels = torch.tensor([[-100, -100, 4, 1, 6], [-100, 2, 3, -100, -100]])  # (B, L): prompt/padding -100
    topk_ids = torch.randint(0, vocab, (bsz, length, k), generator=g)  # (B, L, k)
    topk_logprobs = torch.log_softmax(torch.randn(bsz, length, vocab, generator=g), -1)[
        ..., :k
    ]  # unnormalised over k
    for w in (0.0, 0.7):
        out = distill_loss(logits, labels, topk_ids, topk_logprobs, kl_weight=w)
        loss, ce, kl = _hand_loss(logits, labels, topk_ids, topk_logprobs, w)
        assert out.loss.item() == pytest.approx(loss, rel=1e-5)
        assert out.ce.item() == pytest.approx(ce, rel=1e-5)
        if w > 0:
            assert out.kl.item() == pytest.approx(kl, rel=1e-5) and kl > 0
        else:
            assert out.kl.item() == 0.0
    # kl_weight = 0 is plain SFT: transformers' own causal-LM loss on the same batch
    from transformers.loss.loss_utils import ForCausalLMLoss

    assert distill_loss(logits, labels).loss.item() == pytest.approx(
        ForCausalLMLoss(logits, labels, vocab).item()
    )


def test_kl_vanishes_when_the_verifier_is_the_truncated_proposer():
    vocab, k = 6, 2
    p = torch.tensor([0.5, 0.3, 0.1, 0.05, 0.03, 0.02])
    p_hat = torch.tensor([0.5, 0.3]) / 0.8
    logits = torch.full((1, 2, vocab), -1e4)
    logits[0, 0, :k] = p_hat.log()  # the verifier's softmax is p̂ (its mass outside the top-k is ~0)
    labels = torch.tensor([[-100, 0]])
    topk_ids = torch.tensor([[[0, 1], [0, 1]]])
    topk_logprobs = p[:k].log().expand(1, 2, k)
    assert distill_loss(logits, labels, topk_ids, topk_logprobs, kl_weight=1.0).kl.item() == pytest.approx(
        0, abs=1e-6
    )
    with pytest.raises(ValueError, match="top-k"):
        distill_loss(logits, labels, kl_weight=1.0)


def test_collator_puts_each_top_k_at_its_label_position():
    rows = [
        {
            "input_ids": [5, 6, 7, 8],
            "labels": [-100, -100, 7, 8],
            "topk_ids": [[7, 1], [8, 2]],
            "topk_logprobs": [[-0.1, -2.0], [-0.2, -3.0]],
        },
        {
            "input_ids": [5, 9, 4],
            "labels": [-100, 9, 4],
            "topk_ids": [[9, 3], [4, 3]],
            "topk_logprobs": [[-0.3, -1.0], [-0.4, -1.5]],
        },
    ]
    batch = DistillCollator(pad_token_id=0)(rows)
    assert batch["topk_ids"].shape == (2, 4, 2) and batch["labels"].shape == (2, 4)
    resp = batch["labels"] != -100
    assert torch.equal(batch["topk_ids"][..., 0][resp], batch["labels"][resp])  # top-1 is the label here
    assert torch.equal(batch["topk_ids"][~resp], torch.zeros_like(batch["topk_ids"][~resp]))
    assert batch["topk_logprobs"][1, 2].tolist() == pytest.approx([-0.4, -1.5])


# -- config ------------------------------------------------------------------------------------------------------


def test_distill_config_and_the_tiny_recipe():
    cfg = train_config(["recipe=tiny", "stage=distill"])
    assert cfg.stage.name == Stage.distill and cfg.stage.role == Role.verifier
    assert cfg.stage.init_from == "runs/tiny/verifier-sft" and cfg.output_dir == "runs/tiny/verifier-distill"
    assert cfg.distill.proposer == "runs/tiny/mars" and cfg.distill.generated_dir == "runs/tiny/distill-data"
    assert cfg.distill.method == "prove-lossless" and cfg.trainer.max_minutes
    vsft = train_config(["recipe=tiny", "stage=sft", "stage.role=verifier"])
    assert vsft.output_dir == "runs/tiny/verifier-sft" and vsft.model.scratch.layers == 2
    assert vsft.model.scratch.hidden == 128 and vsft.trainer.max_steps == 600
    assert train_config(["recipe=tiny", "stage=sft"]).model.scratch.layers == 4


def test_the_32b_recipe_distills_proves_3b_verifier_in_bf16():
    """`prove-train --cfg job recipe=qwen2.5-32b stage=distill`: the verifier fine-tuned is ProVe's 3B (was the 32B
    itself), the proposer generates in bf16 (was fp32: 131 GB per GPU) on a sample (was all ~2.15M), batched on
    vLLM with an engine per 2 GPUs."""
    import subprocess as sp

    cfg = train_config(["recipe=qwen2.5-32b", "stage=distill"])
    assert (
        cfg.stage.init_from == "Qwen/Qwen2.5-3B-Instruct"
        and cfg.model.name_or_path == "Qwen/Qwen2.5-32B-Instruct"
    )
    assert (
        cfg.distill.dtype == "bfloat16" and cfg.distill.num_prompts == 16000 and cfg.distill.prompt_seed == 0
    )
    assert (
        cfg.distill.proposer == "runs/qwen2.5-32b/mars"
        and cfg.output_dir == "runs/qwen2.5-32b/verifier-distill"
    )
    assert cfg.distill.backend == "vllm" and cfg.distill.method == "ar"
    assert cfg.distill.vllm.tensor_parallel_size == 2 and cfg.distill.vllm.max_num_seqs == 256
    assert cfg.deepspeed["zero_optimization"]["stage"] == 3
    seven = train_config(["recipe=qwen2.5-32b", "stage=distill", "stage.init_from=Qwen/Qwen2.5-7B-Instruct"])
    assert seven.stage.init_from == "Qwen/Qwen2.5-7B-Instruct"
    # the recipe's verifier and output folder do not leak into the proposer's stages
    sft, mars = (
        train_config(["recipe=qwen2.5-32b", "stage=sft"]),
        train_config(["recipe=qwen2.5-32b", "stage=mars"]),
    )
    assert sft.stage.init_from is None and sft.output_dir == "runs/qwen2.5-32b/sft"
    assert mars.stage.init_from == "runs/qwen2.5-32b/sft" and mars.output_dir == "runs/qwen2.5-32b/mars"
    # the CLI composes the same (what a user runs to check it)
    out = sp.run(
        [
            sys.executable,
            "-m",
            "prove.train.cli",
            "--cfg",
            "job",
            "--resolve",
            "recipe=qwen2.5-32b",
            "stage=distill",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    for line in (
        "init_from: Qwen/Qwen2.5-3B-Instruct",
        "dtype: bfloat16",
        "num_prompts: 16000",
        "backend: vllm",
        "output_dir: runs/qwen2.5-32b/verifier-distill",
    ):
        assert line in out.stdout, line


def test_generation_dtype_defaults_to_bf16_on_gpu_fp32_on_cpu(monkeypatch):
    from prove.train.distill import generation_dtype

    cfg = train_config(["recipe=tiny", "stage=distill"])
    assert cfg.distill.dtype is None and generation_dtype(cfg) == "float32"  # this machine: CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert generation_dtype(cfg) == "bfloat16"
    assert (
        generation_dtype(train_config(["recipe=tiny", "stage=distill", "distill.dtype=float16"])) == "float16"
    )


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["stage=distill"], "stage.init_from"),
        (["stage=distill", "stage.init_from=v", "distill.kl_weight=1", "distill.top_k=0"], "top_k"),
        (["stage=distill", "stage.init_from=v", "distill.method=prove"], "greedy"),
        (
            ["stage=distill", "stage.init_from=v", "distill.method=sd"],
            r"greedy .*\['ar', 'prove-lossless'\]",
        ),  # exact, needs a draft
        (["stage=distill", "stage.init_from=v", "stage.role=proposer"], "trains the verifier"),
        (["stage=distill", "stage.init_from=v", "distill.batch_size=0"], "batch_size=0"),
        (["stage=distill", "stage.init_from=v", "distill.batch_size=8"], "set distill.method=ar"),
        (["stage=distill", "stage.init_from=v", "distill.backend=vLLM"], "pick one of engine, vllm"),
        (
            [
                "stage=distill",
                "stage.init_from=v",
                "distill.backend=vllm",
                "distill.method=ar",
                "distill.batch_size=8",
            ],
            "vLLM batches every prompt by itself: drop distill.batch_size",
        ),
        (["stage=distill", "stage.init_from=v", "distill.vllm.max_num_seqs=0"], "max_num_seqs=0"),
        (["stage=mars", "stage.role=verifier"], "block proposer"),
        (
            ["peft=lora"],
            "peft=lora adapts a pretrained model",
        ),  # the merged checkpoint is rebuilt from the base
    ],
)
def test_distill_config_errors(overrides, match):
    with pytest.raises(ValueError, match=match):
        train_config(overrides)


def test_vllm_slot_gives_each_engine_its_slice_and_gpus():
    """distill.backend=vllm under a launcher: one engine per rank, or one per tensor-parallel group of a node's
    consecutive ranks (its first rank starts it on the group's GPUs), each answering i ≡ part (mod parts)."""
    from prove.train.distill_vllm import vllm_slot

    assert vllm_slot(0, 1, 4, 0, 1) == (0, 1, [])  # no launcher: vLLM splits the engine over the GPUs it sees
    assert [vllm_slot(r, 4, 1, r, 4) for r in range(4)] == [(r, 4, [r]) for r in range(4)]
    # 2 nodes x 4 GPUs, engines of 2 GPUs: ranks 0, 2, 4, 6 start them (local GPUs 0-1 and 2-3 of their node)
    slots = [vllm_slot(r, 8, 2, r % 4, 4) for r in range(8)]
    assert slots == [(0, 4, [0, 1]), None, (1, 4, [2, 3]), None, (2, 4, [0, 1]), None, (3, 4, [2, 3]), None]
    with pytest.raises(ValueError, match="tensor_parallel_size=4 must divide the 2 processes per node"):
        vllm_slot(0, 4, 4, 0, 2)


# -- generation ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory, qwen2_factory, tokenizer):
    """A random 'MARS' proposer (K = 4, with <|mask|>) and a random stock verifier (same tokenizer)."""
    root = tmp_path_factory.mktemp("models")
    proposer = qwen2_factory(len(tokenizer), seed=0, eos_token_id=tokenizer.eos_token_id, init_std=0.3)
    verifier = qwen2_factory(
        len(tokenizer), seed=1, layers=1, hidden=32, heads=2, kv_heads=1, intermediate=64
    )
    return (
        write_checkpoint(root / "mars", proposer, tokenizer, block_size=4),
        write_checkpoint(root / "verifier", verifier, tokenizer),
    )


def _cfg(run_dir: Path, data: Path, models, **kw):
    proposer, verifier = models
    base = {
        "stage": "distill",
        "stage.init_from": str(verifier),
        "distill.proposer": str(proposer),
        "distill.num_prompts": 6,
        "distill.max_new_tokens": 10,
        "distill.top_k": 4,
    }
    base.update(kw)
    return train_config(tiny_overrides(run_dir, data, **base))


def _rows(ds) -> list[dict]:
    return [dict(r) for r in ds]


def test_generated_set_is_the_proposers_greedy_output_with_aligned_top_k(tmp_path, arithmetic_jsonl, models):
    from prove.decode import Decoder

    cfg = _cfg(tmp_path, arithmetic_jsonl, models)
    out = generate_responses(cfg, progress=False)
    ds = build_generated_set(out)
    settings = json.loads((out / "generation.json").read_text())
    assert settings["complete"] and settings["proposer"] == str(models[0]) and settings["block_size"] == 4
    assert settings["method"] == "prove-lossless" and settings["proposer_meta"]["stage"] == "mars"
    assert (out / "dataset" / "state.json").is_file() and len(ds) == 6
    ar = Decoder.from_pretrained(str(models[0]), method="ar")
    for row in ds:
        prompt = row["messages"][:-1]
        assert row["prompt_ids"] == ar.encode(prompt)
        assert (
            row["response_ids"] == ar.generate(prompt, max_new_tokens=10).token_ids
        )  # identical to AR greedy
        assert row["messages"][-1]["role"] == "assistant"
        assert len(row["topk_ids"]) == len(row["response_ids"]) and len(row["topk_ids"][0]) == 4
        # greedy: the response token is the proposer's top-1 at its position, and log-probs are sorted
        assert [t[0] for t in row["topk_ids"]] == row["response_ids"]
        assert all(lp == sorted(lp, reverse=True) and lp[0] <= 0 for lp in row["topk_logprobs"])


def test_batched_generation_is_the_one_at_a_time_greedy_output(tmp_path, arithmetic_jsonl, models):
    """distill.batch_size > 1: left-padded prompts of different lengths, rows ending at different steps (at an
    EOS id, or at the limit), a last batch smaller than the rest — each row token for token the engine's AR."""
    import shutil

    from prove.decode import Decoder

    batched = {"distill.method": "ar", "distill.batch_size": 4}
    first = build_generated_set(generate_responses(_cfg(tmp_path / "a", arithmetic_jsonl, models, **batched)))
    # a proposer that also ends on a token the first prompt's response writes at step 4
    proposer = shutil.copytree(models[0], tmp_path / "mars")
    gen = json.loads((proposer / "generation_config.json").read_text())
    gen["eos_token_id"] = [gen["eos_token_id"], first[0]["response_ids"][3]]
    (proposer / "generation_config.json").write_text(json.dumps(gen))
    cfg = _cfg(tmp_path / "b", arithmetic_jsonl, (proposer, models[1]), **batched)
    ds = build_generated_set(generate_responses(cfg, progress=False))
    ar = Decoder.from_pretrained(str(proposer), method="ar")
    assert len({len(r["prompt_ids"]) for r in ds}) > 1  # the padding is exercised
    assert ds[0]["finished"] and len(ds[0]["response_ids"]) == 4
    assert any(not r["finished"] and len(r["response_ids"]) == 10 for r in ds)
    for row in ds:
        want = ar.generate(row["messages"][:-1], max_new_tokens=10)
        assert row["response_ids"] == want.token_ids and row["messages"][-1]["content"] == want.text
        assert row["finished"] == (want.token_ids[-1] in ar.eos_ids())
        assert [t[0] for t in row["topk_ids"]] == row["response_ids"]
    assert json.loads((tmp_path / "b" / "distill-data" / "generation.json").read_text())["batch_size"] == 4


def test_interrupted_generation_resumes_to_the_same_dataset(tmp_path, arithmetic_jsonl, models):
    whole = build_generated_set(
        generate_responses(_cfg(tmp_path / "a", arithmetic_jsonl, models), progress=False)
    )

    cfg = _cfg(tmp_path / "b", arithmetic_jsonl, models)

    def crash_after_three(rec):
        if rec["index"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        generate_responses(cfg, progress=False, on_record=crash_after_three)
    shard = tmp_path / "b" / "distill-data" / "shards" / "part-00000.jsonl"
    assert len(read_shards(shard.parent)) == 3
    with shard.open("a") as f:  # killed while writing the next record
        f.write('{"index": 3, "id": "x", "messages": [')
    with pytest.raises(ValueError, match="3 of 6 prompts have no response"):
        build_generated_set(tmp_path / "b" / "distill-data")
    seen = []
    generate_responses(cfg, progress=False, on_record=lambda r: seen.append(r["index"]))
    assert seen == [3, 4, 5]  # only what was missing
    resumed = build_generated_set(tmp_path / "b" / "distill-data")
    assert _rows(resumed) == _rows(whole)
    # a finished set is reused; other settings in the same folder are refused
    generate_responses(cfg, progress=False, on_record=lambda r: pytest.fail("regenerated"))
    with pytest.raises(ValueError, match="other settings"):
        generate_responses(_cfg(tmp_path / "b", arithmetic_jsonl, models, **{"distill.max_new_tokens": 11}))


def test_training_rows_are_prove_data_tokenization(tmp_path, arithmetic_jsonl, models, tokenizer):
    """The ids trained on are the generated ids, which are prove.data's chat-template tokenization of
    messages (prompt turns + the response as assistant turn) wherever the response ended on EOS."""
    from prove.data.chat import encode_conversation

    ds = build_generated_set(generate_responses(_cfg(tmp_path, arithmetic_jsonl, models), progress=False))
    # Random weights answer with token soup that need not survive a decode/encode round trip, so the layout is
    # checked with the data's own answers as the response: prompt_ids (as the proposer encoded the prompt) +
    # the response's ids + EOS is exactly prove.data's tokenization of (prompt turns + assistant turn).
    data = [json.loads(line) for line in arithmetic_jsonl.open()]
    eos = tokenizer.eos_token_id
    for row in ds:
        conversation = data[row["index"]]["messages"]
        assert row["messages"][:-1] == conversation[:-1]
        resp = tokenizer(conversation[-1]["content"], add_special_tokens=False)["input_ids"] + [eos]
        encoded, reason, _ = encode_conversation(tokenizer, conversation, 256)
        assert reason is None
        assert encoded["input_ids"] == row["prompt_ids"] + resp
        assert encoded["labels"] == [-100] * len(row["prompt_ids"]) + resp
    rows = training_rows(ds, max_len=256)
    for gen, tr in zip(ds, rows, strict=True):
        p = len(gen["prompt_ids"])
        assert tr["input_ids"] == gen["prompt_ids"] + gen["response_ids"]
        assert tr["labels"] == [-100] * p + gen["response_ids"]
        assert tr["topk_ids"] == gen["topk_ids"]
    short = training_rows(ds, max_len=len(ds[0]["prompt_ids"]) + 2)
    assert all(
        len(r["topk_ids"]) == len(r["input_ids"]) - (len(r["labels"]) - sum(x != -100 for x in r["labels"]))
        for r in short
    )


# -- the stage end to end ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_distill_stage_trains_the_verifier_and_decodes_with_it(tmp_path, arithmetic_jsonl, models, tokenizer):
    from prove.common.checkpoint import read_prove_json
    from prove.decode import Decoder
    from prove.train.pipeline import train
    from transformers import AutoModelForCausalLM

    proposer, verifier = models
    res = train(
        _cfg(tmp_path, arithmetic_jsonl, models, **{"distill.kl_weight": 1.0, "max_steps": 6, "lr": 1e-2})
    )
    assert res.output_dir == tmp_path / "distill" and res.global_step == 6
    logged = [h for h in res.log_history if "loss" in h]
    assert all(h["loss_kl"] > 0 and h["loss_ce"] > 0 for h in logged)
    ls = losses(res.log_history)
    assert sum(ls[-2:]) < sum(ls[:2]), ls
    before = dict(AutoModelForCausalLM.from_pretrained(verifier).named_parameters())
    after = dict(AutoModelForCausalLM.from_pretrained(res.output_dir).named_parameters())
    assert [n for n in before if torch.equal(before[n], after[n])] == []

    meta = read_prove_json(res.output_dir)
    assert meta.stage == "distill" and meta.extra["distilled_from"] == str(proposer)
    assert meta.extra["role"] == "verifier" and meta.extra["kl_weight"] == 1.0 and meta.extra["top_k"] == 4
    assert (
        meta.extra["generation"]["method"] == "prove-lossless"
        and meta.extra["generation"]["num_prompts"] == 6
    )
    assert meta.block_size is None

    # the distilled verifier is ProVe's verifier for its proposer
    dec = Decoder.from_pretrained(str(proposer), method="prove", verifier=str(res.output_dir), theta=0.01)
    out = dec.generate([{"role": "user", "content": "Ana has 3 apples. How many?"}], max_new_tokens=8)
    assert len(out.token_ids) > 0 and out.stats.verifier_passes > 0


def test_distilled_verifier_with_another_tokenizer_is_refused(tmp_path, models, qwen2_factory, corpus):
    """The engine's rule, through the distill stage's own check: the verifier must share the proposer's vocabulary."""
    from prove.data.tokenizer import train_chatml_bpe
    from prove.train.distill import check_same_vocab

    proposer, verifier = models
    from transformers import AutoTokenizer

    check_same_vocab(AutoTokenizer.from_pretrained(verifier), str(proposer))
    other = train_chatml_bpe(corpus[:50], vocab_size=280, with_mask=False)
    with pytest.raises(ValueError, match="tokenizer differs"):
        check_same_vocab(other, str(proposer))


def test_the_stage_refuses_a_mismatched_verifier_before_generating(tmp_path, arithmetic_jsonl, models, corpus,
                                                                  qwen2_factory):  # fmt: skip
    from prove.data.tokenizer import train_chatml_bpe
    from prove.train.pipeline import train

    proposer, _ = models
    other = train_chatml_bpe(corpus[:50], vocab_size=280, with_mask=False)
    alien = tmp_path / "alien"
    qwen2_factory(len(other), eos_token_id=other.eos_token_id).save_pretrained(alien)
    other.save_pretrained(alien)
    cfg = _cfg(tmp_path, arithmetic_jsonl, (proposer, alien))
    with pytest.raises(ValueError, match="tokenizer differs"):
        train(cfg)
    assert not list(Path(cfg.distill.generated_dir).glob("**/*.jsonl")), (
        "nothing generated for a verifier it refuses"
    )


def _constant_proposer(qwen2_factory, vocab: int, token: int, seed: int = 0):
    """A 'MARS' model that proposes ``token`` everywhere with p̃ ≈ 1: its layers write nothing to the residual
    stream (o_proj = down_proj = 0), every embedding row points along one direction u, and the LM head
    scores only ``token`` along u. Its greedy output is ``token`` repeated, and so is every block proposal."""
    model = qwen2_factory(vocab, seed=seed, tie=False)
    u = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()
        model.get_input_embeddings().weight.copy_(u + 0.01 * torch.randn(vocab, u.numel()))
        head = model.get_output_embeddings().weight
        head.zero_()
        head[token] = 20.0 * u / u.norm()
    return model


@pytest.mark.slow
def test_distilled_verifier_commits_more_tokens_per_cycle(
    tmp_path, arithmetic_jsonl, qwen2_factory, tokenizer
):
    """ProVe's claim in miniature: under method=prove at a fixed θ, the verifier distilled on the proposer's
    outputs commits more tokens per cycle on held-out prompts than the same verifier before. (The realistic
    measurement is the tiny recipe's, in docs/benchmarks.md. Here the proposer is a scripted constant model, so
    the effect is certain: the stock verifier rejects its tokens, the distilled one learns them.)"""
    from prove.decode import Decoder
    from prove.train.pipeline import train

    token = tokenizer("apples", add_special_tokens=False)["input_ids"][0]
    proposer = _constant_proposer(qwen2_factory, len(tokenizer), token)
    write_checkpoint(tmp_path / "mars", proposer, tokenizer, block_size=4, base_model="scripted")
    verifier = qwen2_factory(
        len(tokenizer), seed=1, layers=1, hidden=32, heads=2, kv_heads=1, intermediate=64
    )
    write_checkpoint(tmp_path / "verifier", verifier, tokenizer)
    res = train(
        _cfg(
            tmp_path,
            arithmetic_jsonl,
            (tmp_path / "mars", tmp_path / "verifier"),
            **{"distill.num_prompts": 8, "distill.max_new_tokens": 8, "max_steps": 10, "lr": 1e-2},
        )
    )

    held_out = [json.loads(line)["messages"] for line in (arithmetic_jsonl.parent / "test.jsonl").open()][:6]

    def tokens_per_cycle(verifier_dir: Path) -> float:
        dec = Decoder.from_pretrained(
            str(tmp_path / "mars"), method="prove", verifier=str(verifier_dir), theta=0.1
        )
        outs = [dec.generate(m, max_new_tokens=12) for m in held_out]
        assert all(o.token_ids == [token] * 12 for o in outs)  # prove commits only the proposer's tokens
        return sum(o.stats.new_tokens for o in outs) / sum(o.stats.cycles for o in outs)

    before, after = tokens_per_cycle(tmp_path / "verifier"), tokens_per_cycle(res.output_dir)
    assert before < 1.5 and after > 2.5, (before, after)


# -- generation sharded across processes ---------------------------------------------------------------------------


def _torchrun(driver_args: list[str]) -> subprocess.CompletedProcess:
    return torchrun("distill_driver.py", driver_args)


def _shard_indices(shard: Path) -> list[int]:
    return [json.loads(line)["index"] for line in shard.read_text().splitlines() if line.endswith("}")]


@pytest.mark.slow
def test_two_process_generation_partitions_the_prompts_and_a_killed_run_resumes(
    tmp_path, arithmetic_jsonl, models
):
    """Two ranks over gloo: rank r answers prompts i ≡ r (mod 2) into its own shard; rank 1 is killed after one
    record (rank 0 torn down wherever it was); the rerun completes the set — nothing lost, nothing repeated, the
    same dataset as one uninterrupted process."""
    n = 8
    whole = build_generated_set(
        generate_responses(
            _cfg(tmp_path / "one", arithmetic_jsonl, models, **{"distill.num_prompts": n}),
            progress=False,
            rank=0,
            world_size=1,
        )
    )
    overrides = tiny_overrides(
        tmp_path / "two",
        arithmetic_jsonl,
        stage="distill",
        **{
            "stage.init_from": str(models[1]),
            "distill.proposer": str(models[0]),
            "distill.num_prompts": n,
            "distill.max_new_tokens": 10,
            "distill.top_k": 4,
        },
    )
    shards = tmp_path / "two" / "distill-data" / "shards"

    killed = _torchrun(["1", "1", *overrides])
    assert killed.returncode != 0, killed.stdout[-2000:] + killed.stderr[-4000:]
    first = {p.name: _shard_indices(p) for p in shards.glob("*.jsonl")}
    assert len(first.get("part-00001.jsonl", [])) == 1  # rank 1 died after its first record
    assert sum(map(len, first.values())) < n and not (shards.parent / "dataset").exists()

    done = _torchrun(["-1", "0", *overrides])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-6000:]
    final = {p.name: _shard_indices(p) for p in shards.glob("*.jsonl")}
    assert sorted(final) == ["part-00000.jsonl", "part-00001.jsonl"]
    assert sorted(final["part-00000.jsonl"]) == list(range(0, n, 2))  # each rank its slice, each prompt once
    assert sorted(final["part-00001.jsonl"]) == list(range(1, n, 2))
    for name, indices in first.items():  # what the killed run wrote was kept, not regenerated
        assert final[name][: len(indices)] == indices
    resumed = build_generated_set(shards.parent)
    assert _rows(resumed) == _rows(whole)
    assert (
        json.loads((shards.parent / "generation.json").read_text())["dtype"] == "float32"
    )  # fp32 on the CPU


def test_exclude_from_leaves_out_the_prompts_earlier_sets_read(tmp_path, arithmetic_jsonl, models):
    """An on-policy round's prompts (``distill.exclude_from``): the next unread ones, from a prompt file or from
    ``data``, after the earlier sets' recorded ``prompt_ids``; too few left for the later rounds, a set without
    recorded ids, or rows without ids are errors at start (fails if the exclusion is applied after ``num_prompts``
    are taken — fewer prompts — or ignored)."""
    from prove.train.distill import GENERATION_JSON, prompt_set

    earlier = tmp_path / "round-1"
    earlier.mkdir()
    first, _ = prompt_set(_cfg(tmp_path, arithmetic_jsonl, models))
    (earlier / GENERATION_JSON).write_text(json.dumps({"prompt_ids": [p.id for p in first]}))
    rows = [json.loads(x) for x in arithmetic_jsonl.read_text().splitlines()]
    nxt, _ = prompt_set(_cfg(tmp_path, arithmetic_jsonl, models, **{"distill.exclude_from": f"[{earlier}]"}))
    assert [p.id for p in nxt] == [r["id"] for r in rows[6:12]]  # data: the next six rows
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": r["id"], "prompt": r["messages"][0]["content"]}) + "\n" for r in rows[:9])
    )
    from_file = {
        "distill.prompts": str(prompts),
        "distill.exclude_from": f"[{earlier}]",
        "distill.num_prompts": 3,
    }
    nxt, _ = prompt_set(_cfg(tmp_path, arithmetic_jsonl, models, **from_file))
    assert [p.id for p in nxt] == [r["id"] for r in rows[6:9]]  # a prompt file: the three left
    with pytest.raises(ValueError, match="later on-policy rounds 4"):  # 3 unread < 3 + 4
        prompt_set(_cfg(tmp_path, arithmetic_jsonl, models, **{**from_file, "distill.reserve_prompts": 4}))
    with pytest.raises(ValueError, match="only 3 prompts are unread"):  # 3 < num_prompts 6: a too small round
        prompt_set(_cfg(tmp_path, arithmetic_jsonl, models, **{**from_file, "distill.num_prompts": 6}))
    (earlier / GENERATION_JSON).write_text("{}")
    with pytest.raises(ValueError, match="records no prompt_ids"):
        prompt_set(_cfg(tmp_path, arithmetic_jsonl, models, **{"distill.exclude_from": f"[{earlier}]"}))
    with pytest.raises(ValueError, match="holds no generation.json"):
        prompt_set(
            _cfg(tmp_path, arithmetic_jsonl, models, **{"distill.exclude_from": f"[{tmp_path / 'none'}]"})
        )
    (earlier / GENERATION_JSON).write_text(json.dumps({"prompt_ids": ["x"]}))
    no_ids = tmp_path / "no-ids.jsonl"
    no_ids.write_text("".join(json.dumps({"messages": r["messages"]}) + "\n" for r in rows[:8]))
    with pytest.raises(ValueError, match="needs rows with an `id` column"):
        prompt_set(_cfg(tmp_path, no_ids, models, **{"distill.exclude_from": f"[{earlier}]"}))
