"""MARS's block attention on the CPU without a dense mask over the whole trimmed input (docs/design.md §2.1, "On the
CPU").

The trimmed MARS input is ``[noisy | clean]``, N + L columns (:func:`prove.train.masks.trimmed_inputs`). Under the
block rule (:mod:`prove.train.masks`) a clean query never reads a noisy key, so the clean stream is an ordinary causal
sequence of its own; only the N noisy queries need a mask. :data:`BLOCK_ATTENTION` names an attention function,
registered with transformers' ``AttentionInterface`` (and sdpa's mask function under the same name with
``AttentionMaskInterface``), that computes the two parts with two ``scaled_dot_product_attention`` calls:

1. the clean queries against the clean keys, ``is_causal`` (no mask at all): L²/2;
2. the noisy queries against every key, with the noisy rows of the block mask
   (:func:`prove.train.masks.trimmed_noisy_bias`, ``(B, 1, N, N + L)``): N · (N + L);

instead of one kernel over a dense ``(N + L)²`` float mask, which the CPU kernel visits whole.

The function reads the split from the mask it is given: a 4D mask with fewer query rows (N) than the layer has
queries (N + L) is a MARS noisy-rows mask. Every mask transformers itself builds has one row per query (or one row
for one query), so with any other input the function is transformers' sdpa attention unchanged: a model switched to
it (:func:`use_block_attention`) decodes, evaluates and saves as under ``sdpa`` (``save_pretrained`` does not write
the attention implementation).
"""

from __future__ import annotations

from typing import Any

import torch
from prove.train.masks import BLOCK_ATTENTION
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask


def is_noisy_rows_mask(attention_mask: Any, query_len: int) -> bool:
    """True when ``attention_mask`` is a MARS noisy-rows mask for a layer with ``query_len`` queries: a 4D tensor whose
    query dimension is shorter than the queries (and ≥ 1), whose key dimension covers them all."""
    return (
        isinstance(attention_mask, torch.Tensor)
        and attention_mask.ndim == 4
        and 0 < attention_mask.shape[-2] < query_len
        and attention_mask.shape[-1] == query_len
    )


def mars_block_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query`` ``(B, H, T, d)``, ``key``/``value`` ``(B, H_kv, T, d)``;
    returns ``((B, T, H, d), None)``. With a noisy-rows mask ``(B, 1, N, T)`` (:func:`is_noisy_rows_mask`): the
    first N queries attend every key under it, the last T − N attend the last T − N keys causally; else sdpa."""
    t = query.shape[2]
    if not is_noisy_rows_mask(attention_mask, t):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    n = attention_mask.shape[-2]
    kwargs.pop("is_causal", None)
    clean, _ = sdpa_attention_forward(
        module,
        query[:, :, n:],
        key[:, :, n:],
        value[:, :, n:],
        None,
        dropout,
        scaling,
        is_causal=True,
        **kwargs,
    )  # (B, L, H, d): the clean stream reads only itself, causally
    noisy, _ = sdpa_attention_forward(
        module, query[:, :, :n], key, value, attention_mask, dropout, scaling, is_causal=False, **kwargs
    )  # (B, N, H, d): own block + the clean prefix before it, under the mask
    return torch.cat([noisy, clean], dim=1), None  # (B, T, H, d)


AttentionInterface.register(BLOCK_ATTENTION, mars_block_attention)
AttentionMaskInterface.register(BLOCK_ATTENTION, sdpa_mask)  # every other call builds sdpa's masks


def use_block_attention(model: Any) -> None:
    """Switch ``model`` (a ``PreTrainedModel``, or a PEFT model around one) to :data:`BLOCK_ATTENTION`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.set_attn_implementation(BLOCK_ATTENTION)


def mars_attention_impl(choice: str, model_impl: str | None) -> str | None:
    """The attention a MARS step runs for ``stage.attention`` = ``choice`` (``auto``, ``blocks``, ``mask``) on a model
    whose attention is ``model_impl``: :data:`BLOCK_ATTENTION`, or the model's own (which then takes one mask over the
    whole input: :func:`prove.train.masks.trimmed_attention_mask`)."""
    choice = str(choice)
    if choice not in ("auto", "blocks", "mask"):
        raise ValueError(f"stage.attention={choice}: use auto, blocks or mask")
    if choice == "blocks" or (choice == "auto" and model_impl in ("sdpa", BLOCK_ATTENTION)):
        return BLOCK_ATTENTION
    if model_impl == BLOCK_ATTENTION:  # mask on a model switched earlier: sdpa with the whole mask
        return "sdpa"
    return model_impl
