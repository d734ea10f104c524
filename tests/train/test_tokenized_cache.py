"""The tokenized set's cache key: the same before and after <|mask|> is added (mars reads what sft built) and after
a save and reload (mars's tokenizer is sft's output), different when the rows would differ."""

from __future__ import annotations

import copy

from prove.train.rows import cache_key, tokenizer_fingerprint

from tests.train.helpers import tiny_overrides, train_config


def test_the_key_leaves_the_mask_token_out_and_nothing_else(tmp_path, stock_tokenizer, arithmetic_jsonl):
    from transformers import AutoTokenizer

    cfg = train_config(tiny_overrides(tmp_path, arithmetic_jsonl, stage="sft"))
    mars = train_config(tiny_overrides(tmp_path, arithmetic_jsonl, stage="mars"))
    tok = copy.deepcopy(stock_tokenizer)
    before = cache_key(cfg, tok)
    tok.add_special_tokens({"additional_special_tokens": ["<|mask|>"]}, replace_extra_special_tokens=False)
    assert "<|mask|>" in tok.get_vocab() and cache_key(mars, tok) == before
    tok.save_pretrained(tmp_path / "saved")
    assert cache_key(mars, AutoTokenizer.from_pretrained(tmp_path / "saved")) == before
    # what changes the rows changes the key
    assert cache_key(train_config(tiny_overrides(tmp_path, arithmetic_jsonl, max_len=64)), tok) != before
    other = copy.deepcopy(tok)
    other.add_special_tokens({"additional_special_tokens": ["<|tool|>"]}, replace_extra_special_tokens=False)
    assert tokenizer_fingerprint(other, "<|mask|>") != tokenizer_fingerprint(tok, "<|mask|>")
    other.chat_template = "{{ messages }}"
    assert tokenizer_fingerprint(other, "<|mask|>") != tokenizer_fingerprint(tok, "<|mask|>")
