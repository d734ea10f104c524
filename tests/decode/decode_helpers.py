"""Helpers shared by the decode tests (imported as a sibling module, like tests/train/train_helpers.py)."""

from __future__ import annotations

import torch


def mask_ids(tokenizer) -> list[int]:
    """The ``<|mask|>`` id of ``tokenizer`` as a list (empty without one): what the Decoder never outputs."""
    from prove.decode.checkpoint import MASK_TOKEN

    vocab = tokenizer.get_vocab()
    return [vocab[MASK_TOKEN]] if MASK_TOKEN in vocab else []


def hf_generate(
    model,
    ids: list[int],
    n: int,
    eos: int | None = None,
    assistant=None,
    assistant_tokens: int = 5,
    *,
    suppress: list[int] | None = None,
) -> list[int]:
    """transformers' own greedy continuation of ``ids`` (``n`` new tokens at most): the reference every
    lossless method must reproduce. With ``assistant``: assisted generation, ``assistant_tokens`` per round
    on a constant schedule with the confidence cut-off off (our greedy SD's configuration). ``suppress``
    (``mask_ids(tokenizer)``): ids never generated, transformers' ``suppress_tokens``; the Decoder never
    outputs ``<|mask|>``, which a random test model's greedy argmax does pick now and then."""
    kw: dict = {"suppress_tokens": suppress} if suppress else {}
    if assistant is not None:
        gc = assistant.generation_config
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = assistant_tokens, "constant"
        gc.assistant_confidence_threshold = 0.0
        kw["assistant_model"] = assistant
    out = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
        **kw,
    )
    return out[0, len(ids) :].tolist()
