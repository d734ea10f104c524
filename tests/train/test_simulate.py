"""``python -m prove.train.simulate``: prove-lossless decoded on our engine, then the same prompts and outputs scored
as stage mars's eval scores its rows — on a checkpoint that really accepts deep blocks."""

from __future__ import annotations

import json
import random

import pytest
import torch

from tests.train.helpers import write_checkpoint

K = 4
CYCLE = ["x", "y", "z"]
"""The answer: the letters after the prompt's last one, round and round (x → y → z → x), 22 of them, then EOS."""
ANSWER = 22
TOLERANCE = 0.10
"""How far the simulation may land from decoding: tokens per cycle (relative) and each depth's acceptance."""


@pytest.fixture(scope="module")
def mars_ckpt(tmp_path_factory, qwen2_factory, tokenizer):
    """A tiny Qwen2 MARS-trained (K = 4, 100 steps, ~10 s) on a trivially predictable answer: it proposes whole
    blocks right, so acceptance reaches depth 4 (a random model's stops at depth 1, where a simulation read at the
    wrong depth scores the same)."""
    from datasets import Dataset
    from prove.data.loading import MASK_TOKEN
    from prove.train.collate import Collator
    from prove.train.trainer import MarsTrainer
    from transformers import TrainingArguments

    ids = [tokenizer.convert_tokens_to_ids(c) for c in CYCLE]
    q = tokenizer.convert_tokens_to_ids("q")
    rng = random.Random(0)
    rows = []
    for _ in range(256):
        phase = rng.randrange(3)
        answer = [ids[(phase + 1 + j) % 3] for j in range(ANSWER)] + [tokenizer.eos_token_id]
        rows.append({"input_ids": [q, q, ids[phase], *answer], "labels": [-100] * 3 + answer})
    model = qwen2_factory(
        len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.train()
    out = tmp_path_factory.mktemp("sim")
    args = TrainingArguments(
        output_dir=str(out / "run"), use_cpu=True, report_to=[], per_device_train_batch_size=16, max_steps=100,
        learning_rate=3e-3, lr_scheduler_type="constant", warmup_steps=0, save_strategy="no", seed=0,
        remove_unused_columns=False, disable_tqdm=True, logging_steps=100,
    )  # fmt: skip
    MarsTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        data_collator=Collator(tokenizer.pad_token_id or 0, tokenizer.eos_token_id, K),
        mask_token_id=tokenizer.convert_tokens_to_ids(MASK_TOKEN),
        block_size=K,
    ).train()
    return write_checkpoint(out / "mars", model.eval(), tokenizer, block_size=K)


def _run(ckpt, tmp_path, name: str) -> dict:
    from prove.train.simulate import main

    prompts = tmp_path / "p.jsonl"  # two categories: by_category splits the same decodes
    rows = [{"prompt": f"qq{c}", "category": "one" if c == "x" else "two"} for c in CYCLE]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / f"{name}.json"
    assert main(["--model", str(ckpt), "--prompts", str(prompts), "--max-new-tokens", "30",
                 "--batch-size", "2", "--out", str(out)]) == 0  # fmt: skip
    return json.loads(out.read_text())


def test_the_simulation_lands_near_decoding_its_own_greedy_outputs(mars_ckpt, tmp_path, monkeypatch):
    """Catches a simulation that reads a depth at the wrong position (off by one: within tolerance on a model that
    accepts nothing past depth 1, far off here) and per-depth acceptance counted otherwise than the decoder counts it
    (a depth proposed past the end of turn is proposed, not accepted: left out, depths 3-4 read 1.0 here)."""
    from prove.decode import Decoder

    r = _run(mars_ckpt, tmp_path, "aligned")
    measured, sim = r["measured"], r["simulated_on_greedy_outputs"]
    # what the decoder committed, pooled over the prompts: every answer to its end of turn
    dec = Decoder.from_pretrained(str(mars_ckpt), method="prove-lossless")
    stats = [dec.generate(f"qq{c}", 30).stats for c in CYCLE]
    assert measured["new_tokens"] == sum(s.new_tokens for s in stats) == 3 * (ANSWER + 1)
    assert measured["tokens_per_cycle"] == pytest.approx(
        measured["new_tokens"] / sum(s.cycles for s in stats)
    )
    # the checkpoint really accepts deep: depth 4 in most cycles
    assert measured["accept_by_depth"][1] >= 0.9 and measured["accept_by_depth"][3] >= 0.6, measured
    # labels that are the model's own greedy tokens: no block is off-policy
    assert sim["offpolicy"] == 0.0 and sim["blocks"] > 0
    assert abs(r["relative_error"]) <= TOLERANCE, r
    assert r["relative_error"] == pytest.approx(sim["tokens_per_cycle"] / measured["tokens_per_cycle"] - 1)
    # the walk's estimate: a harmonic mean, never above the aligned one, and as near the decode here
    walked = r["walk_estimate"]["tokens_per_cycle"]
    assert walked <= sim["tokens_per_cycle"] + 1e-9 and abs(r["walk_relative_error"]) <= TOLERANCE, r
    assert len(r["walk_estimate"]["accept_by_depth"]) == len(measured["accept_by_depth"])
    for got, want in zip(sim["accept_by_depth"], measured["accept_by_depth"], strict=True):
        assert abs(got - want) <= TOLERANCE, (sim, measured)
    # by category: each category's own prompts, summing back to the pooled counts (a row filed under the wrong
    # category, or counted twice, breaks the sums), each simulated on its own rows
    cats = r["by_category"]
    assert set(cats) == {"one", "two"}
    assert cats["one"]["measured"]["prompts"] == 1 and cats["two"]["measured"]["prompts"] == 2
    for key in ("new_tokens", "cycles"):
        assert sum(c["measured"][key] for c in cats.values()) == measured[key]
    assert sum(c["simulated_on_greedy_outputs"]["blocks"] for c in cats.values()) == sim["blocks"]

    # the same simulation reading each depth one position late: outside the tolerance
    from prove.train import trainer

    real = trainer.block_acceptance
    monkeypatch.setattr(
        trainer, "block_acceptance", lambda clean, noisy, *a: real(clean, torch.roll(noisy, -1, dims=1), *a)
    )
    shifted = _run(mars_ckpt, tmp_path, "shifted")
    assert abs(shifted["relative_error"]) > TOLERANCE, shifted


def test_a_block_size_above_the_trained_one_is_refused(mars_ckpt, tmp_path):
    from prove.train.simulate import main

    with pytest.raises(SystemExit, match="above the trained K = 4"):
        main(["--model", str(mars_ckpt), "--prompts", str(tmp_path / "none.jsonl"), "--block-size", "8"])


def test_a_suite_is_read_by_category(mars_ckpt, tmp_path):
    """--suite mt-bench with the tests' copy of its file: MT-bench's categories, per_category prompts each."""
    from pathlib import Path

    from prove.train.simulate import main

    mini = Path(__file__).resolve().parents[1] / "data" / "suites" / "mt_bench_mini.jsonl"
    out = tmp_path / "suite.json"
    assert main(["--model", str(mars_ckpt), "--suite", "mt-bench", "--suite-file", f"mt-bench={mini}",
                 "--per-category", "1", "--max-new-tokens", "8", "--out", str(out)]) == 0  # fmt: skip
    r = json.loads(out.read_text())
    categories = {json.loads(x)["category"] for x in mini.read_text().splitlines()}
    assert set(r["by_category"]) == categories
    assert all(c["measured"]["prompts"] == 1 for c in r["by_category"].values())
    assert r["prompts"] == "suite mt-bench"


def test_prompts_or_a_suite_not_both_nor_neither(mars_ckpt, tmp_path):
    from prove.train.simulate import main

    with pytest.raises(SystemExit, match="give --prompts FILE or --suite"):
        main(["--model", str(mars_ckpt)])
    with pytest.raises(SystemExit, match="mt-bench-2 needs first answers"):
        main(["--model", str(mars_ckpt), "--suite", "mt-bench-2"])
