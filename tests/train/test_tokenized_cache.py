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
    # a generated task keys on its settings: the same key before and after it is written
    synth = tiny_overrides(tmp_path, tmp_path / "gen" / "train.jsonl", **{"data.synthetic.n": 40})
    synth = [o for o in synth if not o.startswith("data.synthetic=")]
    before_written = cache_key(train_config(synth), tok)
    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "train.jsonl").write_text("{}\n")
    assert cache_key(train_config(synth), tok) == before_written
    assert cache_key(train_config([*synth, "data.synthetic.n=41"]), tok) != before_written
    # what changes the rows changes the key
    assert cache_key(train_config(tiny_overrides(tmp_path, arithmetic_jsonl, max_len=64)), tok) != before
    other = copy.deepcopy(tok)
    other.add_special_tokens({"additional_special_tokens": ["<|tool|>"]}, replace_extra_special_tokens=False)
    assert tokenizer_fingerprint(other, "<|mask|>") != tokenizer_fingerprint(tok, "<|mask|>")
    other.chat_template = "{{ messages }}"
    assert tokenizer_fingerprint(other, "<|mask|>") != tokenizer_fingerprint(tok, "<|mask|>")


def test_a_nodes_other_processes_wait_for_the_first_ones_set(
    tmp_path, tokenizer, arithmetic_jsonl, monkeypatch
):
    """LOCAL_RANK 1 builds nothing: it waits on the marker file the node's first process writes last (no
    collective, so no barrier timeout), then reads the same rows."""
    import threading

    from prove.train import rows

    cfg = train_config(tiny_overrides(tmp_path, arithmetic_jsonl, stage="sft"))
    final = tmp_path / "tokenized" / rows.cache_key(cfg, tokenizer)

    def never(*args):
        raise AssertionError("a process other than the node's first tokenized the rows")

    monkeypatch.setattr(rows, "_build", never)
    monkeypatch.setenv("LOCAL_RANK", "1")
    built = {}

    def first_process():
        import datasets

        ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]], "labels": [[-100, 2, 3]]})
        tmp = final.with_name(final.name + ".tmp")
        ds.save_to_disk(str(tmp))
        (tmp / rows.MARKER).write_text('{"report": "kept 1/1", "rows": 1}\n')
        tmp.rename(final)
        built["done"] = True

    threading.Timer(1.0, first_process).start()
    got = rows.tokenized_dataset(cfg, tokenizer)
    assert built["done"] and got["input_ids"] == [[1, 2, 3]]
