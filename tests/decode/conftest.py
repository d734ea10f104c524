"""Decode-test fixtures: tiny random Qwen2 models whose greedy output is varied (not one repeated token),
and a saved checkpoint that satisfies the checkpoint contract (model + tokenizer + prove.json)."""

from __future__ import annotations

import pytest
from prove.common.checkpoint import MASK_TOKEN, ProveMeta, write_prove_json

TRAINED_BLOCK = 4


@pytest.fixture(scope="session")
def make_lm(qwen2_factory, tokenizer):
    def make(seed: int = 0, std: float = 0.3, vocab: int | None = None, **kw):
        return qwen2_factory(vocab or len(tokenizer), seed=seed, init_std=std, **kw)

    return make


@pytest.fixture(scope="session")
def lm(make_lm):
    """The model being accelerated (a random 'MARS' model: its <|mask|> row is just another embedding)."""
    return make_lm(seed=0)


@pytest.fixture(scope="session")
def small(make_lm):
    """A different random model of the same vocabulary: ProVe's verifier."""
    return make_lm(seed=1, std=0.2)


@pytest.fixture(scope="session")
def prompts(tokenizer) -> list[list[int]]:
    texts = ["Ana has 3 apples", "How many coins does Ben have?", "7"]
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Cleo has 4 pens and gets 5 more."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    return [tokenizer(t)["input_ids"] for t in texts] + [
        tokenizer(chat, add_special_tokens=False)["input_ids"]
    ]


def save_checkpoint(path, model, tok, *, stage: str = "mars", block_size: int | None = TRAINED_BLOCK):
    model.save_pretrained(path)
    tok.save_pretrained(path)
    mask_id = tok.convert_tokens_to_ids(MASK_TOKEN) if MASK_TOKEN in tok.get_vocab() else None
    meta = ProveMeta(
        stage=stage,
        base_model="tiny-random",
        block_size=block_size if stage == "mars" else None,
        mask_token=MASK_TOKEN if mask_id is not None else None,
        mask_token_id=mask_id,
    )
    write_prove_json(path, meta)
    return str(path)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory, lm, small, tokenizer, stock_tokenizer, make_lm, corpus):
    """Saved checkpoints: ``mars`` (mask token, K=4) and its ``verifier`` (same tokenizer); ``stock`` (no
    mask token) and ``mars_on_stock`` (stock tokenizer + an added <|mask|>, as MARS training does: the
    stock checkpoint is then a valid ProVe verifier for it); ``alien`` (a different vocabulary)."""
    import copy

    from prove.data.tokenizer import train_chatml_bpe

    root = tmp_path_factory.mktemp("ckpt")
    alien_tok = train_chatml_bpe([c.upper() for c in corpus], vocab_size=280)
    added = copy.deepcopy(stock_tokenizer)
    added.add_special_tokens({"additional_special_tokens": [MASK_TOKEN]})
    return {
        "mars": save_checkpoint(root / "mars", lm, tokenizer),
        "verifier": save_checkpoint(root / "verifier", small, tokenizer, stage="distill"),
        "stock": save_checkpoint(
            root / "stock", make_lm(seed=2, vocab=len(stock_tokenizer)), stock_tokenizer, stage="sft"
        ),
        "mars_on_stock": save_checkpoint(root / "mars_on_stock", make_lm(seed=5, vocab=len(added)), added),
        "alien": save_checkpoint(
            root / "alien", make_lm(seed=3, vocab=len(alien_tok)), alien_tok, stage="sft"
        ),
    }
