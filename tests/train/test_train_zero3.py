"""A real 2-process DeepSpeed ZeRO-3 run of the mars stage on CPU (gloo, torchrun), and its gathered checkpoint."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.numerics import assert_logits_match
from tests.train.helpers import tiny_overrides, torchrun, train_config, write_checkpoint

pytestmark = pytest.mark.slow


def _zero3_mars(
    tmp_path, tokenizer, qwen2_factory, data, *, max_steps: int, lr: float, driver_args=(), **extra
) -> dict:
    """An sft checkpoint written to ``tmp_path/sft``, then a 2-process ZeRO-3 mars run from it (torchrun,
    ``zero3_driver.py``) into ``tmp_path/mars``; returns the driver's in-memory reference (``torch.load``)."""
    sft = tmp_path / "sft"
    write_checkpoint(
        sft,
        qwen2_factory(
            len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
        ),
        tokenizer,
    )
    overrides = tiny_overrides(
        tmp_path,
        data,
        model="hf",
        stage="mars",
        deepspeed="zero3",
        max_steps=max_steps,
        lr=lr,
        **{
            "model.name_or_path": str(sft),
            "stage.init_from": str(sft),
            "trainer.per_device_train_batch_size": 4,
            **extra,
        },
    )
    out = tmp_path / "inmemory.pt"
    proc = torchrun("zero3_driver.py", [str(out), *driver_args, *overrides])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load(out)


def _eval_blocks(tmp_path, data, rows: int) -> float:
    """The blocks the eval set of ``rows`` rows holds (they depend on the rows only, not on the model): each row once,
    whatever the ranks."""
    from prove.train.acceptance import block_acceptance
    from prove.train.collate import Collator
    from prove.train.rows import tokenized_dataset
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "mars")
    cfg = train_config(
        tiny_overrides(tmp_path, data, model="hf", stage="mars", **{"model.name_or_path": "x"})
    )
    held = tokenized_dataset(cfg, tok).train_test_split(test_size=rows, seed=cfg.trainer.seed, shuffle=True)[
        "test"
    ]
    batch = Collator(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, block_size=4)(list(held))
    zeros = torch.zeros(batch["labels"].shape, dtype=torch.long)
    return float(block_acceptance(zeros, zeros, zeros.float(), batch["labels"], 4, [tok.eos_token_id]).blocks)


def test_zero3_two_process_mars_checkpoint_matches_in_memory_model(
    tmp_path, tokenizer, qwen2_factory, arithmetic_jsonl
):
    pytest.importorskip("deepspeed")
    from transformers import AutoModelForCausalLM

    # eval: 9 held-out rows over 2 ranks in batches of 2 (rank 1's third forward has no row of its own)
    evals = {"eval.rows": 9, "eval.steps": 2, "eval.batch_size": 2}
    ref = _zero3_mars(tmp_path, tokenizer, qwen2_factory, arithmetic_jsonl, max_steps=4, lr=1e-3, **evals)
    sft = tmp_path / "sft"
    assert ref["world_size"] == 2 and ref["global_step"] == 4
    assert [h["step"] for h in ref["evals"]] == [2, 4]
    assert all(h["eval_blocks"] == _eval_blocks(tmp_path, arithmetic_jsonl, rows=9) for h in ref["evals"])
    assert ref["logs"] and all(math.isfinite(h["loss"]) for h in ref["logs"])
    # The logged loss is noisy + ar_weight × clean (ar_weight 1), not that times the number of processes
    # (what transformers does to a compute_loss_func loss). Terms are rank 0's, the loss the ranks' mean.
    for h in ref["logs"]:
        assert 0.75 < h["loss"] / (h["loss_noisy"] + h["loss_clean"]) < 1.33, h
    mars = tmp_path / "mars"
    meta = json.loads((mars / "prove.json").read_text())
    assert meta["stage"] == "mars" and meta["block_size"] == 4
    model = AutoModelForCausalLM.from_pretrained(
        mars
    ).eval()  # a plain HF dir: the 16-bit weights were gathered
    with torch.no_grad():
        logits = model(input_ids=ref["input_ids"]).logits
    assert_logits_match(
        logits, ref["logits"], model
    )  # the worker's pass under ZeRO-3 against the saved model's
    before = AutoModelForCausalLM.from_pretrained(sft)
    assert not torch.equal(before.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_zero3_two_process_lora_leaves_a_merged_checkpoint_that_decodes(tmp_path, tokenizer, qwen2_factory,
                                                                       arithmetic_jsonl):  # fmt: skip
    """LoRA under DeepSpeed used to leave only ``adapter/``: the output dir must hold the merged model + tokenizer +
    prove.json (rank 0 rebuilds it on the CPU from the base + adapter), equal to the in-memory adapted model; with
    eval.best (scores scripted to peak at step 1) that model is checkpoint-1's, reloaded into the engine."""
    pytest.importorskip("deepspeed")
    from prove.decode import Decoder
    from prove.train.saving import merge_adapter
    from transformers import AutoModelForCausalLM

    ref = _zero3_mars(
        tmp_path,
        tokenizer,
        qwen2_factory,
        arithmetic_jsonl,
        max_steps=2,
        lr=1e-2,
        peft="lora",
        driver_args=["--best-at=1"],  # eval.best: the engine reloads checkpoint-1, whose adapter is merged
        **{
            "eval.rows": 8,
            "eval.steps": 1,
            "trainer.save_steps": 1,
            "eval.best": "true",
            "peft.r": 4,
            "peft.alpha": 8,
            "peft.dropout": 0.0,
            # peft's trainable-token rows gather their ZeRO-3 weights on torch.cuda.current_device(): GPU-only, so
            # the <|mask|> row stays frozen here (it is already a row of the base model's embedding)
            "peft.train_mask_token": "false",
        },
    )
    mars = tmp_path / "mars"
    assert (mars / "adapter" / "adapter_config.json").is_file()
    assert (mars / "config.json").is_file() and (mars / "tokenizer_config.json").is_file()
    meta = json.loads((mars / "prove.json").read_text())
    assert meta["stage"] == "mars" and meta["block_size"] == 4 and meta["peft"] == "lora"
    sft = tmp_path / "sft"
    merged = AutoModelForCausalLM.from_pretrained(mars).eval()
    with torch.no_grad():
        assert_logits_match(merged(input_ids=ref["input_ids"]).logits, ref["logits"], merged)
        before = AutoModelForCausalLM.from_pretrained(sft).eval()(input_ids=ref["input_ids"]).logits
    assert not torch.allclose(before, ref["logits"], atol=1e-4)  # the adapter trained: not the base model
    meta_eval = meta["eval"]
    assert meta_eval["best"]["step"] == 1 and meta_eval["output"]["step"] == 1
    # the written model is checkpoint-1's adapter merged, not the step-2 one training ended with
    x = ref["input_ids"]
    best = AutoModelForCausalLM.from_pretrained(merge_adapter(sft, mars / "checkpoint-1", tmp_path / "b"))
    last = AutoModelForCausalLM.from_pretrained(merge_adapter(sft, mars / "checkpoint-2", tmp_path / "l"))
    with torch.no_grad():
        want, other, got = (
            best.eval()(input_ids=x).logits,
            last.eval()(input_ids=x).logits,
            merged(input_ids=x).logits,
        )
    assert_logits_match(got, want, merged)
    assert not torch.allclose(got, other, atol=1e-4)
    dec = Decoder.from_pretrained(str(mars), method="prove-lossless")
    res = dec.generate([{"role": "user", "content": "Ana has 3 apples. How many?"}], max_new_tokens=6)
    ar = Decoder.from_pretrained(str(mars), method="ar").generate(
        [{"role": "user", "content": "Ana has 3 apples. How many?"}], max_new_tokens=6
    )
    assert len(res.token_ids) > 0 and res.token_ids == ar.token_ids
