"""The tiny recipe's tokenizer (docs/design.md §5): ChatML + <|mask|>, ≤ 512 tokens, ~95 tokens per example.

A tokenizer that merged " 7" into one token gave ~77 tokens per example; ours splits digits as Qwen2
does (so a Qwen2 checkpoint reloads it identically), which costs ~18 tokens per example: docs/design.md §5
records ~93 (the mean over 3,000 rows with the recipe's 20k-row tokenizer).
"""

from __future__ import annotations

import statistics

import pytest
from prove.data.chat import tokenize_conversation
from prove.data.synthetic import generate_arithmetic
from prove.data.tokenizer import (
    CHATML_TEMPLATE,
    CHATML_TEMPLATE_NO_SYSTEM,
    MASK_TOKEN,
    build_tiny_tokenizer,
    render_chatml,
)


@pytest.fixture(scope="module")
def rows():
    return generate_arithmetic(3000, seed=0)


@pytest.fixture(scope="module")
def tiny(rows):
    return build_tiny_tokenizer(rows[:2500])


def test_vocab_and_specials(tiny, rows):
    assert 400 < len(tiny) <= 512  # the merges run out before 512 on this small corpus
    assert tiny.eos_token == "<|im_end|>" and tiny.pad_token == "<|endoftext|>"
    assert tiny.convert_tokens_to_ids(MASK_TOKEN) != tiny.unk_token_id
    assert tiny.chat_template == CHATML_TEMPLATE_NO_SYSTEM
    stock = build_tiny_tokenizer(rows[:200], 400, with_mask=False)
    assert len(stock) == 400 and MASK_TOKEN not in stock.get_vocab()


def test_tokens_per_example(tiny, rows):
    """Held-out rows: ~95 tokens per example (docs/design.md §5 records ~93; digits are split one per token)."""
    lengths = [len(tokenize_conversation(tiny, r["messages"], 512)["input_ids"]) for r in rows[2500:]]
    assert 85 <= statistics.mean(lengths) <= 105 and max(lengths) < 128


def test_roundtrip(tiny, rows):
    text = render_chatml(rows[-1]["messages"], default_system=False)
    assert tiny.decode(tiny(text, add_special_tokens=False)["input_ids"]) == text


@pytest.mark.parametrize("generation_prompt", [False, True])
@pytest.mark.parametrize("default_system", [False, True])
def test_render_chatml_matches_the_template(tokenizer, generation_prompt, default_system):
    template = CHATML_TEMPLATE if default_system else CHATML_TEMPLATE_NO_SYSTEM
    for messages in (
        [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    ):
        expected = tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=generation_prompt
        )
        assert (
            render_chatml(messages, add_generation_prompt=generation_prompt, default_system=default_system)
            == expected
        )


def test_saved_tokenizer_keeps_the_template(tmp_path, rows):
    """The trainer builds it from a datasets.Dataset and saves it with the checkpoint; decode reloads it."""
    import datasets
    from transformers import AutoTokenizer

    ds = datasets.Dataset.from_list(
        rows[:300] + [{"id": "x", "messages": [{"role": "user", "content": None}], "answer": ""}]
    )
    build_tiny_tokenizer(ds, 400).save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.chat_template == CHATML_TEMPLATE_NO_SYSTEM and len(loaded) == 400
    assert loaded.eos_token == "<|im_end|>" and MASK_TOKEN in loaded.get_vocab()
    messages = rows[-1]["messages"]
    assert loaded.apply_chat_template(messages, tokenize=False) == render_chatml(
        messages, default_system=False
    )


def test_reload_as_qwen2_tokenizes_identically(tmp_path, tiny, rows):
    """transformers 5.x reloads a checkpoint's tokenizer through the model type's class (Qwen2Tokenizer),
    which rebuilds normalizer and pre-tokenizer from its own defaults: ours must already be those."""
    from transformers import AutoTokenizer, Qwen2Config

    tiny.save_pretrained(tmp_path)
    Qwen2Config(vocab_size=len(tiny)).save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert type(loaded).__name__ == "Qwen2Tokenizer"
    for r in rows[2500:2700]:
        text = loaded.apply_chat_template(r["messages"], tokenize=False)
        assert loaded.encode(text, add_special_tokens=False) == tiny.encode(text, add_special_tokens=False)
    assert loaded.convert_tokens_to_ids(MASK_TOKEN) == tiny.convert_tokens_to_ids(MASK_TOKEN)
