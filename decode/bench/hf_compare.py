"""``hf_compare``: ours vs transformers' ``generate`` (AR vs greedy, SD vs assisted generation) on a random
model of a real shape (``prove.decode.random_models``) with a layer-skip draft, on random prompt ids."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prove.decode.bench.config import BenchConfig


HF_PAIRS = (("ar", "hf-greedy"), ("sd", "hf-assisted"))
"""(our row, transformers' row) whose paired time ratio ``hf_compare`` reports."""


def hf_compare_setup(cfg: BenchConfig) -> tuple[dict[str, Any], list[list[int]]]:
    """``hf_compare``'s random-weight target and layer-skip draft, and its random prompts."""
    from prove.decode.config import DTYPES
    from prove.decode.random_models import SHAPES, random_prompts, random_target_and_draft

    if cfg.dtype not in DTYPES:
        raise ValueError(f"dtype={cfg.dtype!r} is not one of {DTYPES}")
    assert cfg.hf_compare is not None
    target, draft = random_target_and_draft(
        cfg.hf_compare, cfg.draft_layers, dtype=cfg.dtype, device=cfg.device, deep_scale=cfg.deep_scale
    )
    vocab = SHAPES[cfg.hf_compare]["vocab_size"]
    prompts = random_prompts(cfg.n_prompts or 3, cfg.prompt_len, vocab)
    return {"tokenizer": None, "model": target, "draft": draft}, prompts

