"""The MARS training step (docs/design.md §2.1, "What a training step computes"), composed once: the batch's trimmed
``[noisy | clean]`` input and its attention mask (:mod:`prove.train.masks`), the decoder's final hidden states at the
targets only (:func:`final_hidden`), the head and the cross-entropy there, and the loss
(:mod:`prove.train.losses`). :class:`MarsStep` is what ``MarsTrainer.compute_loss`` and its eval pass,
``tools/bench_mars_step.py``'s ``mars`` variant and the GPU check (``prove.recipes.gpu_check.training``) run.

Imports torch, transformers and prove.train's pure parts only — no hydra, omegaconf, peft, accelerate or datasets —
so that ``make gpu-check``, which has only torch and transformers, runs the trainer's own step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from prove.data.chat import IGNORE_INDEX
from prove.train.attention import mars_attention_impl, use_block_attention
from prove.train.losses import MarsLoss, depth_weights, head_cross_entropy, mars_loss_terms
from prove.train.masks import (
    BLOCK_ATTENTION,
    TrimmedInputs,
    noisy_depth,
    trimmed_attention_mask,
    trimmed_inputs,
    trimmed_targets,
)

MASK_CACHE_SIZE = 64
"""Masks a caching :class:`MarsStep` keeps before it starts again (one per batch layout)."""


def final_hidden(model, unwrapped, input_ids, position_ids, attention_mask, embed=None) -> torch.Tensor:
    """``(B, T, H)``: the decoder's last hidden state (after the final norm) in a forward of ``model`` (the
    DeepSpeed engine or DDP wrapper when there is one), read by a forward hook on ``unwrapped.get_decoder()``.

    Behind a wrapper (``model`` is not ``unwrapped``) the model runs whole, so ZeRO-3's hooks gather and release each
    layer and DDP's see the forward as in any step; ``logits_to_keep=1`` keeps its own head to one position (a
    ``(B, 1, V)`` output that nothing reads), the head at the targets being applied by the caller. Unwrapped, only the
    decoder runs (no head call at all: under LoRA with a trainable ``<|mask|>`` row, a head call copies the whole
    vocabulary-sized weight), fed ``embed(input_ids)`` when ``embed`` is given
    (:func:`target_embedding`)."""
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


# -- the trainable <|mask|> row at the targets -------------------------------------------------------------------


def _trained_rows(module: Any, kind: type) -> tuple[Any, torch.Tensor, torch.Tensor] | None:
    """``(base, rows (R, H), index (R,))`` when ``module`` is PEFT's trainable-token layer (or its wrapper), unmerged,
    with one active adapter, around a frozen module of exactly ``kind`` (no subclass: a scaled embedding scales) whose
    weight every process holds whole; else None."""
    try:
        from peft.tuners.trainable_tokens.layer import TrainableTokensLayer
        from peft.utils.other import TrainableTokensWrapper
    except ImportError:  # no peft (the GPU check's python): no module can be its layer
        return None

    layer = (
        module.token_adapter if isinstance(module, TrainableTokensWrapper) else module
    )  # the wrapper calls it
    if (
        not isinstance(layer, TrainableTokensLayer)
        or layer.merged
        or layer.disable_adapters
        or getattr(module, "disable_adapters", False)
    ):
        return None
    base = layer.get_base_layer()
    adapters = list(layer.active_adapters)
    weight = getattr(base, "weight", None)
    if (
        type(base) is not kind
        or len(adapters) != 1
        or weight is None
        or weight.requires_grad
        or hasattr(weight, "ds_id")  # ZeRO-3: the module's hooks gather it; keep PEFT's own call
    ):
        return None
    name = adapters[0]
    index = torch.tensor(layer.token_indices[name], device=weight.device)
    return base, layer.trainable_tokens_delta[name], index


def target_head(head: Any) -> Any:
    """The head the MARS loss applies at its targets (``head``: the model's output-embedding module).

    Under LoRA with a trainable ``<|mask|>`` row (``peft.train_mask_token``), ``head`` is PEFT's ``TrainableTokensLayer``
    (inside its ``TrainableTokensWrapper``) around the frozen linear head: at every call it copies the whole V × H
    weight with the trained rows put in, and its backward pass makes that weight's full V × H gradient to keep R rows
    of it. Here instead the frozen base weight makes the logits (its backward makes only the hidden states' gradient)
    and the trained rows' own products replace their R columns: the same logits, and a gradient of R rows
    (n × H × R) that reaches the same ``trainable_tokens_delta`` parameter, so the adapter saves and merges in PEFT's
    own format. Any other head (no adapter, a merged or disabled one, a trained head weight, a bias, ZeRO-3's
    partitioned weights, several active adapters) is returned as it is."""
    found = _trained_rows(head, torch.nn.Linear)
    if found is None or found[0].bias is not None:
        return head
    base, rows, index = found

    def apply(hidden: torch.Tensor) -> torch.Tensor:
        logits = base(hidden)  # (n, V) from the frozen weight
        logits[..., index] = torch.nn.functional.linear(
            hidden, rows.to(hidden.dtype)
        )  # (n, R) the trained rows
        return logits

    return apply


def target_embedding(embedding: Any) -> Any | None:
    """The input embedding of a MARS step, as :func:`target_head` for the head: under PEFT's trainable ``<|mask|>`` row,
    the frozen embedding's vectors with the trained rows put in where their ids are (``(B, T) → (B, T, H)``), so no
    V × H weight is copied in the forward pass nor made as a gradient in the backward one; ``None`` where PEFT's own
    module is to be called (the same cases as :func:`target_head`, and an embedding that scales or renormalises)."""
    found = _trained_rows(embedding, torch.nn.Embedding)
    if found is None or found[0].max_norm is not None:
        return None
    base, rows, index = found

    def apply(ids: torch.Tensor) -> torch.Tensor:
        out = base(ids)  # (B, T, H) from the frozen weight
        hit = ids[..., None] == index  # (B, T, R)
        trained = hit.to(rows.dtype) @ rows  # (B, T, H): the trained row where its id is
        return torch.where(hit.any(dim=-1, keepdim=True), trained.to(out.dtype), out)

    return apply


# -- the step ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MarsTargets:
    """What a step's forward yields at its targets (the ``n`` positions of the trimmed input with a label)."""

    hidden: torch.Tensor
    """``(n, H)`` the decoder's final hidden states there."""
    targets: torch.Tensor
    """``(n,)`` the token each is to predict."""
    rows: torch.Tensor
    """``(n,)`` its example."""
    cols: torch.Tensor
    """``(n,)`` its column of the trimmed input (< ``inputs.noisy_len``: a noisy target)."""
    inputs: TrimmedInputs
    mask: Any
    """The attention mask the forward ran with (:func:`prove.train.masks.trimmed_attention_mask`)."""

    @property
    def noisy(self) -> torch.Tensor:
        """``(n,)`` True on the noisy-stream targets."""
        return self.cols < self.inputs.noisy_len


@dataclass(frozen=True)
class MarsStepLoss:
    """A step's loss terms (:class:`prove.train.losses.MarsLoss`) and the targets they were computed at."""

    terms: MarsLoss
    at: MarsTargets

    @property
    def loss(self) -> torch.Tensor:
        return self.terms.loss


class MarsStep:
    """MARS's training step on a batch ``{input_ids, labels[, attention_mask]}`` ``(B, L)`` whose examples are each a
    multiple of K long (:class:`prove.train.collate.Collator`).

    :meth:`loss`: the input ``[noisy | clean]`` without the noisy blocks before ``(P − 1) // K``
    (:func:`prove.train.masks.trimmed_inputs`: they hold no target and nothing reads them), its attention mask for
    ``impl`` (:func:`prove.train.masks.trimmed_attention_mask`; kept per batch layout with ``cache_masks``), the
    decoder's final hidden states at the targets (:func:`final_hidden`, the input embedding from
    :func:`target_embedding`), the head there (:func:`target_head`: a trainable ``<|mask|>`` row's gradient is its
    own row's), the cross-entropy ``ce_chunk_rows`` at a time (:func:`prove.train.losses.head_cross_entropy`) and
    :func:`prove.train.losses.mars_loss_terms` (the noisy targets weighted by depth when ``depth_decay`` < 1)."""

    def __init__(
        self,
        mask_token_id: int,
        block_size: int,
        impl: str | None,
        *,
        ar_weight: float = 1.0,
        ce_chunk_rows: int | None = None,
        depth_decay: float = 1.0,
        cache_masks: bool = False,
    ):
        self.mask_token_id = mask_token_id
        self.block_size = block_size
        self.impl = impl
        """The attention the mask is built for: :data:`prove.train.masks.BLOCK_ATTENTION` or the model's own."""
        self.ar_weight = ar_weight
        self.ce_chunk_rows = ce_chunk_rows
        self.depth_decay = depth_decay
        self._masks: dict[tuple, Any] | None = {} if cache_masks else None

    @classmethod
    def for_model(
        cls, model: Any, attention: str, mask_token_id: int, block_size: int, **kwargs: Any
    ) -> MarsStep:
        """The step for ``stage.attention`` = ``attention`` on ``model`` (:func:`prove.train.attention.mars_attention_impl`
        of its attention implementation), switching ``model`` to the block attention when that is the one picked."""
        impl = mars_attention_impl(
            attention, getattr(getattr(model, "config", None), "_attn_implementation", None)
        )
        if impl == BLOCK_ATTENTION:
            use_block_attention(model)
        return cls(mask_token_id, block_size, impl, **kwargs)

    def attention_mask(self, x: TrimmedInputs, dtype: torch.dtype) -> Any:
        """The mask of ``x``; with ``cache_masks``, kept by everything it depends on (attention kind, dtype, device,
        L, N and where each example's noisy part starts)."""
        if self._masks is None:
            return trimmed_attention_mask(self.impl, x, self.block_size, dtype)
        key = (self.impl, dtype, str(x.ids.device), x.ids.shape[1], x.noisy_len, tuple(x.starts.tolist()))
        if key not in self._masks:
            if len(self._masks) > MASK_CACHE_SIZE:
                self._masks.clear()
            self._masks[key] = trimmed_attention_mask(self.impl, x, self.block_size, dtype)
        return self._masks[key]

    def targets(self, model: Any, unwrapped: Any, batch: dict[str, Any]) -> MarsTargets:
        """The forward of the trimmed ``[noisy | clean]`` input, read at the targets. ``model``: what runs (a DeepSpeed
        engine or DDP wrapper when there is one); ``unwrapped``: the model inside it (:func:`final_hidden`)."""
        ids, labels = batch["input_ids"], batch["labels"]  # (B, L)
        x = trimmed_inputs(ids, labels, batch.get("attention_mask"), self.mask_token_id, self.block_size)
        # the model's dtype, not the embedding's .weight: PEFT's trainable-token wrapper merges a copy to read it
        mask = self.attention_mask(x, unwrapped.dtype)
        t = trimmed_targets(labels, x)  # (B, T)
        rows, cols = (t != IGNORE_INDEX).nonzero(as_tuple=True)  # (n,) each
        embed = target_embedding(unwrapped.get_input_embeddings())
        hidden = final_hidden(model, unwrapped, x.ids, x.position_ids, mask, embed)  # (B, T, H)
        return MarsTargets(hidden[rows, cols], t[rows, cols], rows, cols, x, mask)

    def noisy_weight(self, labels: torch.Tensor, at: MarsTargets) -> torch.Tensor | None:
        """``(n,)`` the depth weight of each target (:func:`prove.train.losses.depth_weights`; read at the noisy ones),
        or None when ``depth_decay`` is 1 (MARS's uniform noisy loss)."""
        if self.depth_decay == 1.0:
            return None
        length = labels.shape[1]
        idx = torch.arange(length, device=labels.device).expand_as(labels)
        first = torch.where(labels != IGNORE_INDEX, idx, length).min(dim=1).values  # (B,) P
        depth = noisy_depth(at.inputs.stream_index[at.rows, at.cols], first[at.rows], self.block_size)  # (n,)
        return depth_weights(depth, self.depth_decay)

    def loss_terms(self, ce: torch.Tensor, labels: torch.Tensor, at: MarsTargets) -> MarsLoss:
        """The loss from the CE ``(n,)`` of ``at``'s targets (:func:`prove.train.losses.mars_loss_terms`)."""
        weight = self.noisy_weight(labels, at)
        return mars_loss_terms(ce, at.rows, at.noisy, labels.shape[0], self.ar_weight, weight)

    def loss(self, model: Any, unwrapped: Any, batch: dict[str, Any]) -> MarsStepLoss:
        """The step's loss on ``batch`` (``model``, ``unwrapped``: as in :meth:`targets`)."""
        at = self.targets(model, unwrapped, batch)
        head = target_head(unwrapped.get_output_embeddings())
        ce = head_cross_entropy(head, at.hidden, at.targets, self.ce_chunk_rows)  # (n,)
        return MarsStepLoss(self.loss_terms(ce, batch["labels"], at), at)
