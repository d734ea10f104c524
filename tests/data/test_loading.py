"""prove.data.loading: the one home of loading and the contract checks that training and decoding share."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from prove.data import loading


def test_auto_dtype_is_float32_on_the_cpu_and_the_checkpoint_dtype_elsewhere():
    assert loading.torch_dtype("auto", "cpu") is torch.float32
    assert loading.torch_dtype("auto", "cuda:0") == "auto"
    assert loading.torch_dtype("bfloat16", "cpu") is torch.bfloat16


def test_unknown_dtype_names_the_key_and_the_choices():
    with pytest.raises(ValueError, match=r"model.dtype='fp8': use one of auto, float32, bfloat16, float16"):
        loading.check_dtype("fp8", "model.dtype")
    loading.check_dtype(None, "distill.dtype", allow_none=True)
    with pytest.raises(ValueError, match="null, auto"):
        loading.check_dtype("half", "distill.dtype", allow_none=True)


def test_missing_local_checkpoint_is_a_user_error(tmp_path):
    with pytest.raises(ValueError, match=r"no model at '.*nope': train it first"):
        loading.check_source(str(tmp_path / "nope"), "train it first")
    loading.check_source("Qwen/Qwen2.5-0.5B-Instruct", "unused")  # a hub id is not checked locally


def test_load_model_places_and_evals(tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=32,
    )
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(tmp_path)
    model = loading.load_model(str(tmp_path), "auto", device="cpu")
    assert not model.training and next(model.parameters()).dtype is torch.float32
    assert loading.load_model(str(tmp_path), "bfloat16").dtype is torch.bfloat16


def test_imports_neither_train_nor_decode():
    code = "import sys, prove.data.loading; print(sorted(m for m in sys.modules if m.startswith(('prove.train', 'prove.decode'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_num_layers_keeps_the_first_layers_with_the_final_norm_and_head(tmp_path, tokenizer, qwen2_factory):
    full = qwen2_factory(len(tokenizer), layers=3)
    full.save_pretrained(tmp_path)
    cut = loading.load_model(str(tmp_path), "float32", num_layers=2)
    assert cut.config.num_hidden_layers == len(cut.model.layers) == 2
    want, got = full.state_dict(), cut.state_dict()
    assert set(got) == {k for k in want if not k.startswith("model.layers.2.")}
    # the kept layers, the final norm and the head exactly as they were
    assert all(torch.equal(got[k], want[k]) for k in got)
    with pytest.raises(ValueError, match="has 3 decoder layers; keep between 1 and 3"):
        loading.load_model(str(tmp_path), "float32", num_layers=4)  # would add random layers silently
