"""The mask token (spare row or resize), and the LoRA variant: trains, saves an adapter that reloads and merges."""

from __future__ import annotations

import math

import pytest
import torch
from prove.train.modeling import ensure_mask_token
from prove.train.pipeline import train
from prove.train.saving import merge_adapter

from tests.numerics import assert_logits_match
from tests.train.helpers import losses, tiny_overrides, train_config, write_checkpoint


def _stock_dir(tmp_path, stock_tokenizer, qwen2_factory, rows=None):
    model = qwen2_factory(rows or len(stock_tokenizer), eos_token_id=stock_tokenizer.eos_token_id, seed=3)
    return write_checkpoint(tmp_path / "base", model, stock_tokenizer)


@pytest.mark.parametrize("spare", [True, False])
def test_mask_token_takes_a_spare_row_else_resizes(stock_tokenizer, qwen2_factory, spare):
    import copy

    tok = copy.deepcopy(stock_tokenizer)
    rows = len(tok) + 16 if spare else len(tok)
    model = qwen2_factory(rows)
    before = model.get_input_embeddings().weight.detach().clone()
    mask_id = ensure_mask_token(model, tok, "<|mask|>")
    assert mask_id == len(stock_tokenizer) and tok.convert_tokens_to_ids("<|mask|>") == mask_id
    assert "<|mask|>" in tok.all_special_tokens
    after = model.get_input_embeddings().weight
    assert after.shape[0] == (rows if spare else len(tok))
    assert torch.equal(after[: before.shape[0]], before)  # existing rows untouched
    assert ensure_mask_token(model, tok, "<|mask|>") == mask_id  # idempotent


@pytest.mark.slow
def test_lora_mars_adapter_reloads_and_merges(tmp_path, stock_tokenizer, qwen2_factory, arithmetic_jsonl):
    from peft import PeftModel
    from prove.common.checkpoint import config_mask_id
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_dir = _stock_dir(tmp_path, stock_tokenizer, qwen2_factory)
    over = tiny_overrides(
        tmp_path / "run",
        arithmetic_jsonl,
        model="hf",
        stage="mars",
        peft="lora",
        lr=5e-3,
        **{
            "model.name_or_path": str(base_dir),
            "stage.init_from": "null",
            "data.chat_template": "chatml",
            "peft.r": 4,
            "peft.alpha": 8,
            "peft.dropout": 0.0,
        },
    )
    res = train(train_config(over))
    ls = losses(res.log_history)
    assert all(math.isfinite(x) for x in ls) and sum(ls[-3:]) < sum(ls[:3])

    adapter = res.output_dir / "adapter"
    assert (adapter / "adapter_config.json").is_file() and (adapter / "prove.json").is_file()
    weights = load_file(adapter / "adapter_model.safetensors")
    lora_b = [v for k, v in weights.items() if "lora_B" in k]
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b)  # B starts at zero: every one trained
    assert any("trainable_tokens" in k for k in weights)  # the <|mask|> row travels with the adapter

    tok = AutoTokenizer.from_pretrained(res.output_dir)
    mask_id = tok.convert_tokens_to_ids("<|mask|>")
    x = torch.tensor([[5, 9, 17, 40, mask_id, mask_id]])
    assert config_mask_id(res.output_dir) == mask_id  # the merged checkpoint is a vLLM parallel drafter

    merged = AutoModelForCausalLM.from_pretrained(res.output_dir).eval()
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    base.resize_token_embeddings(len(tok))
    reloaded = PeftModel.from_pretrained(base, adapter).eval()
    with torch.no_grad():
        want = merged(input_ids=x).logits
        assert_logits_match(reloaded(input_ids=x).logits, want, merged)  # LoRA's extra GEMMs
        offline = AutoModelForCausalLM.from_pretrained(
            merge_adapter(base_dir, adapter, tmp_path / "m")
        ).eval()
        assert_logits_match(offline(input_ids=x).logits, want, merged)
        assert config_mask_id(tmp_path / "m") == mask_id
        # the adapter changes the model's outputs (it is not a no-op)
        with reloaded.disable_adapter():
            assert not torch.allclose(reloaded(input_ids=x).logits, want, atol=1e-4)
