"""The forward of a MARS step that stops before the head (docs/design.md §2.1, "What a training step computes"):
the decoder's final hidden states, for the caller to apply the head at the targets only. Imports only torch (the
GPU check runs it without the Trainer's dependencies)."""

from __future__ import annotations

import torch


def final_hidden(model, unwrapped, input_ids, position_ids, attention_mask, embed=None) -> torch.Tensor:
    """``(B, T, H)``: the decoder's last hidden state (after the final norm) in a forward of ``model`` (the
    DeepSpeed engine or DDP wrapper when there is one), read by a forward hook on ``unwrapped.get_decoder()``.

    Behind a wrapper (``model`` is not ``unwrapped``) the model runs whole, so ZeRO-3's hooks gather and release each
    layer and DDP's see the forward as in any step; ``logits_to_keep=1`` keeps its own head to one position (a
    ``(B, 1, V)`` output that nothing reads), the head at the targets being applied by the caller. Unwrapped, only the
    decoder runs (no head call at all: under LoRA with a trainable ``<|mask|>`` row, a head call copies the whole
    vocabulary-sized weight), fed ``embed(input_ids)`` when ``embed`` is given
    (:func:`prove.train.modeling.target_embedding`)."""
    if model is unwrapped:
        ids = {"input_ids": input_ids} if embed is None else {"inputs_embeds": embed(input_ids)}
        out = unwrapped.get_decoder()(
            **ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=False
        )
        return out.last_hidden_state
    captured: list[torch.Tensor] = []

    def keep(module, args, output):
        captured.append(output[0] if isinstance(output, tuple) else output.last_hidden_state)

    handle = unwrapped.get_decoder().register_forward_hook(keep)
    try:
        model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            use_cache=False,
            logits_to_keep=1,
        )
    finally:
        handle.remove()
    assert len(captured) == 1, f"the decoder ran {len(captured)} times in one forward"
    return captured[0]
