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

    prompts = tmp_path / "p.txt"
    prompts.write_text("".join(f"qq{c}\n" for c in CYCLE))
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
    for got, want in zip(sim["accept_by_depth"], measured["accept_by_depth"], strict=True):
        assert abs(got - want) <= TOLERANCE, (sim, measured)

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
