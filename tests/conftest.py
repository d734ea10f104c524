"""Shared fixtures: a tokenizer trained in-process and tiny random Qwen2 models (fp32), never downloaded."""

from __future__ import annotations

import getpass
import os
import random
import tempfile

import pytest
import torch  # reads no environment variable below at import: transformers is imported later

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a hub miss otherwise hangs ~50 s
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the fast path's remembered self-checks (prove.decode.engine.device.checked): the session's own, never the user's
os.environ["PROVE_CACHE_DIR"] = tempfile.mkdtemp(prefix="prove-test-cache-")
# inductor's on-disk cache (torch 2.13) is not keyed by the kernel path ATen and MKL are told to take: code compiled
# under ATEN_CPU_CAPABILITY=avx512 and loaded under avx2 computed garbage tokens or aborted here. A run that picks a
# path (docs/design.md, testing) gets a cache of its own.
_PATH = "-".join(os.environ.get(v, "") for v in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")).strip("-")
if _PATH and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}_{_PATH.lower()}"
    )


def _corpus(n: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    names = ["Ana", "Ben", "Cleo", "Dev", "Eli", "Fay"]
    things = ["apples", "marbles", "coins", "books", "pens"]
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        nm, th = rng.choice(names), rng.choice(things)
        out.append(
            f"{nm} has {a} {th} and gets {b} more. How many {th} does {nm} have? "
            f"{nm} starts with {a}, so {a} + {b} = {a + b}. The answer is {a + b}."
        )
    return out


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    return _corpus()


@pytest.fixture(scope="session")
def tokenizer(corpus):
    """ChatML byte-level BPE (~300 tokens) with ``<|mask|>``."""
    from prove.data.tokenizer import train_chatml_bpe

    return train_chatml_bpe(corpus, vocab_size=300)


@pytest.fixture(scope="session")
def stock_tokenizer(corpus):
    """The same tokenizer without ``<|mask|>`` (a model never block-trained)."""
    from prove.data.tokenizer import train_chatml_bpe

    return train_chatml_bpe(corpus, vocab_size=300, with_mask=False)


def make_qwen2(
    vocab_size: int,
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    seed: int = 0,
    attn: str = "eager",
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    tie: bool = True,
    init_std: float | None = None,
):
    """A tiny random Qwen2ForCausalLM in eval mode, fp32, deterministic for a given seed.

    ``init_std`` re-draws every weight matrix with that std: at the default init (0.02) a random Qwen2
    greedily repeats one token forever, which would hide cache and acceptance bugs; 0.3 gives varied output.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=1024,
        tie_word_embeddings=tie,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        attn_implementation=attn,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    if init_std is not None:
        redraw(model, init_std, seed)
    return model


def redraw(model, std: float, seed: int):
    """Every weight matrix of ``model`` drawn anew from N(0, std²), deterministically for ``seed``."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, std, generator=g)
    return model


@pytest.fixture(scope="session")
def qwen2_factory():
    """``qwen2_factory(vocab_size, **kw)`` builds a tiny random Qwen2 (see ``make_qwen2``)."""
    return make_qwen2
