"""A static KV cache written at explicit slots (docs/design.md §3, "The device cycle"): the device cycle's cache.

``SlotCache`` is a ``transformers`` ``Cache`` whose layers preallocate their K/V (zeroed) for ``capacity``
slots and write each pass's new entries at the slots the engine names (``set_slots``), never cropping (``resize`` reallocates it between requests). The engine owns the valid length: rejecting a draft leaves the length where it was, and the next
pass simply overwrites the stale slots. Positions come from ``position_ids`` alone. A pass attends only the
slots in use, rounded up to a power of two (``view``, ``bucket``): its attention calls ``cache.update(k, v,
layer_idx)`` and gets back views of the first ``view`` slots, and the engine passes a float additive 4D mask over
exactly those (``slot_mask``), which transformers hands to the attention unchanged (``masking_utils`` returns a 4D
mask as given). So any Hugging Face causal LM with full attention runs unmodified, a pass costs the slots in use,
not the slots allocated, and the mask hides every slot in the view a row may not see.

Stale slots never poison a pass: the buffers start zeroed and only ever hold K/V a model computed (finite), a
masked key gets probability exactly 0, and a pass's padding rows write only to scratch slots past the valid
length. A tree pass (``prove.decode.engine.fused``) lays its chain out at slot = position; an accepted entry off the
chain is moved into place by ``gated_copy``: a fixed number of (source, destination) slot pairs, each applied
only where its gate is set, so the copy has one shape whatever was accepted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class SlotLayer(CacheLayerMixin):
    """One attention layer's K/V buffers (1, H, capacity, D), allocated zeroed at the first write (when the
    head count, head size, dtype and device are known from the model's own key states)."""

    is_compileable = True
    is_sliding = False

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, dk = key_states.shape
        dv = value_states.shape[-1]
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = torch.zeros(b, h, self.capacity, dk, dtype=key_states.dtype, device=key_states.device)
        self.values = torch.zeros(
            b, h, self.capacity, dv, dtype=value_states.dtype, device=value_states.device
        )
        self.is_initialized = True

    def write(self, key_states: torch.Tensor, value_states: torch.Tensor, slots: torch.Tensor) -> None:
        """Write the pass's entries (1, H, W, D) at ``slots`` (W,) in place (a fixed buffer address)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self.keys is not None and self.values is not None
        self.keys.index_copy_(2, slots, key_states)
        self.values.index_copy_(2, slots, value_states)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise RuntimeError("a SlotLayer is written through its SlotCache, which knows the pass's slots")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.capacity, 0

    def release(self) -> None:
        """Drop the buffers (a ``SlotCache.resize``): the next write allocates them at the new capacity."""
        self.keys = self.values = None
        self.is_initialized = False

    def get_seq_length(self) -> int:
        raise RuntimeError("the engine owns a SlotCache's valid length: read SlotCache.length")

    def get_max_length(self) -> int:
        return self.capacity


class SlotCache(Cache):
    """K/V for ``capacity`` slots in each of ``num_layers`` layers, written at the slots of ``set_slots``.

    ``length`` is the engine's valid length (what ``get_seq_length`` reports to a model that asks): the
    cache never tracks it itself, so a rejection is a length, not a crop.
    """

    def __init__(self, num_layers: int, capacity: int) -> None:
        super().__init__(layers=[SlotLayer(capacity) for _ in range(num_layers)])
        self.capacity = capacity
        self.view = capacity
        """Slots the next pass attends: 0..view−1 (``bucket``), the slots in use rounded up. A pass reads no slot
        past it, whatever the buffers hold there, and its mask spans exactly these."""
        self.length = 0
        self.slots: torch.Tensor | None = None
        self.compileable = True

    def resize(self, capacity: int) -> None:
        """Reallocate every layer for ``capacity`` slots (what they held is dropped: a request's prefill rewrites
        every slot it reads). New buffer addresses: a CUDA graph captured on the old ones must be captured again."""
        for layer in self.layers:
            assert isinstance(layer, SlotLayer)
            layer.release()
            layer.capacity = capacity
        self.capacity = self.view = capacity

    def grow(self, capacity: int) -> None:
        """Reallocate every layer for ``capacity`` ≥ the current capacity slots, keeping what the slots hold (the
        engine's runners grow mid-request)."""
        for layer in self.layers:
            assert isinstance(layer, SlotLayer)
            if layer.is_initialized:
                assert layer.keys is not None and layer.values is not None
                for name in ("keys", "values"):
                    old = getattr(layer, name)
                    new = old.new_zeros(*old.shape[:2], capacity, old.shape[-1])
                    new[:, :, : old.shape[2]] = old
                    setattr(layer, name, new)
            layer.capacity = capacity
        self.capacity = self.view = capacity

    @classmethod
    def for_model(cls, model: Any, capacity: int) -> SlotCache:
        return cls(int(model.config.num_hidden_layers), capacity)

    def set_slots(self, slots: torch.Tensor) -> None:
        """The slots (W,) long the next pass's W entries are written at, in order."""
        self.slots = slots

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.slots is not None, "set_slots before a pass"
        layer = self.layers[layer_idx]
        assert isinstance(layer, SlotLayer)
        layer.write(key_states, value_states, self.slots)
        assert layer.keys is not None and layer.values is not None
        return layer.keys[:, :, : self.view], layer.values[:, :, : self.view]  # views: no copy

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.view, 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.capacity

    @property
    def is_compileable(self) -> bool:  # type: ignore[override]
        """What transformers reads to decide whether a one-row pass given no mask may run sdpa unmasked: not
        while compiling or capturing (``compileable``, the default), where the pass must keep one shape; yes on an
        eager engine (``FastEngine.exact_views``), whose unmasked row sees every slot of its view."""
        return self.compileable

    def fill(self, value: float | torch.Tensor) -> None:
        """Overwrite every allocated slot with ``value`` (tests fill stale slots with finite garbage)."""
        for layer in self.layers:
            assert isinstance(layer, SlotLayer)
            if layer.is_initialized:
                assert layer.keys is not None and layer.values is not None
                layer.keys.copy_(torch.as_tensor(value).expand_as(layer.keys))
                layer.values.copy_(torch.as_tensor(value).expand_as(layer.values))

    def gated_copy(self, src: torch.Tensor, dst: torch.Tensor, gate: torch.Tensor) -> None:
        """For each pair i of the fixed-size (N,) ``src`` / ``dst`` slot lists, copy slot ``src[i]``'s K/V to slot
        ``dst[i]`` where ``gate[i]`` is True, in every layer; pairs whose gate is False leave ``dst[i]`` as it was.

        One shape whatever was accepted, and no host sync: a gated-off pair rewrites its destination with its own
        value (read before any write, so pairs never see each other's writes)."""
        for layer in self.layers:
            assert isinstance(layer, SlotLayer)
            if not layer.is_initialized:
                continue
            assert layer.keys is not None and layer.values is not None
            for buf in (layer.keys, layer.values):
                moved = buf.index_select(2, src)  # (1, H, N, D)
                kept = buf.index_select(2, dst)
                buf.index_copy_(2, dst, torch.where(gate[None, None, :, None], moved, kept))


MIN_BUCKET = 64
"""The narrowest view a pass attends (``bucket``): below it a graph per width and bucket would buy nothing."""


def bucket(used: int, capacity: int) -> int:
    """The view of a pass whose highest slot is ``used`` − 1: the smallest power of two ≥ ``used`` (at least
    ``MIN_BUCKET``), capped at ``capacity``. Powers of two keep the graphs and compiles one per (width, bucket) —
    log₂(capacity / 64) buckets at most — for at most twice the attention reads of the slots in use."""
    if used > capacity:
        raise ValueError(f"a pass needs {used} slots of a {capacity}-slot cache")
    return min(capacity, max(MIN_BUCKET, 1 << max(used - 1, 0).bit_length()))


def slot_mask(
    rows_see: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The float additive 4D mask (1, 1, W, capacity) of a pass from its (W, capacity) bool "row may see slot":
    0 where it may, ``finfo(dtype).min`` elsewhere (eager attention adds the mask: a bool 4D mask is wrong there)."""
    zero = torch.zeros((), dtype=dtype, device=rows_see.device)
    low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=rows_see.device)
    return torch.where(rows_see, zero, low)[None, None]


def linear_see(start: torch.Tensor, width: int, capacity: int) -> torch.Tensor:
    """(W, capacity) bool of a causal pass of ``width`` rows written at slots start..start+width−1 (slot = position):
    row r sees slots 0..start+r, i.e. the valid prefix and the pass's own rows up to itself. ``start`` is a 0-d long
    tensor (a device value: no host sync, no recompile as it moves)."""
    slots = torch.arange(capacity, device=start.device)  # (S,)
    last = start + torch.arange(width, device=start.device)  # (W,)
    return slots[None, :] <= last[:, None]


def linear_mask(start: torch.Tensor, width: int, capacity: int, dtype: torch.dtype) -> torch.Tensor:
    """The float mask of ``linear_see``."""
    return slot_mask(linear_see(start, width, capacity), dtype)


def attention_window(config: Any) -> tuple[int | None, bool]:
    """(the sliding window, whether only some layers slide) of a model: (W, True) for a model with ``layer_types``
    that has sliding layers (Qwen2 past ``max_window_layers``, Gemma), (W, False) for one whose every layer slides
    (Mistral: ``sliding_window`` and no ``layer_types``), (None, False) for full attention."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return (window, True) if window and "sliding_attention" in layer_types else (None, False)
    if window and getattr(config, "use_sliding_window", True):
        return window, False
    return None, False


def pass_mask(
    config: Any,
    see: torch.Tensor,
    rows_pos: torch.Tensor,
    dtype: torch.dtype,
    *,
    slot_positions: torch.Tensor | None = None,
) -> Any:
    """The ``attention_mask`` to pass a model of ``config`` for a pass whose (W, S) ``see`` says which slot each row
    may read and whose rows sit at positions ``rows_pos`` (W,): the float mask of ``see``, and for a sliding model
    the same with each row's window applied (a row at position p reads slot s only if p − s < W) — for every layer
    (Mistral), or as transformers' per-layer-type mapping ``{"full_attention": …, "sliding_attention": …}`` (Qwen2,
    Gemma). The window is applied in slot space: the valid prefix sits at slot = position, and an entry a pass writes
    past its position (a tree's or a block pass's scratch) lies within the pass's span of the row, which the fast
    path keeps below the window (``FastEngine``'s refusal). ``slot_positions`` (S,), where the caller knows each
    slot's position (``ModelRunner``, on the host), applies the window in position space instead: exact for any
    layout."""
    full = slot_mask(see, dtype)
    window, per_layer = attention_window(config)
    if window is None:
        return full
    slots = torch.arange(see.shape[1], device=see.device) if slot_positions is None else slot_positions
    near = slot_mask(see & (rows_pos[:, None] - slots[None, :] < window), dtype)
    return {"full_attention": full, "sliding_attention": near} if per_layer else near


def tree_mask(
    valid: torch.Tensor, slots: torch.Tensor, local: torch.Tensor, capacity: int, dtype: torch.dtype
) -> torch.Tensor:
    """Mask of a tree pass: its W rows written at ``slots`` (W,); every row sees the valid prefix (slots below
    ``valid``, a 0-d long tensor) and the pass's own entries that ``local`` (W, W) bool allows."""
    pos = torch.arange(capacity, device=slots.device)
    see = (pos[None, :] < valid).expand(local.shape[0], capacity).clone()
    see[:, slots] |= local
    return slot_mask(see, dtype)


GROUPED_SDPA = "prove_grouped_sdpa"
"""The attention implementation the device cycle runs an sdpa model's passes under (``grouped_sdpa``)."""


def grouped_sdpa(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """sdpa with grouped-query attention kept native under a mask: the g = H / H_kv query heads that share a K/V
    head are folded into its rows (query (B, H, W, D) → (B, H_kv, g·W, D), the mask repeated g times along the rows),
    so one sdpa call reads each K/V head once. transformers' sdpa instead repeats every K/V head g times whenever a
    mask is given (``repeat_kv``: a copy of the cache's view in every layer, every pass). Exact attention either way;
    anything else (no mask, a per-head mask, no grouping, dropout) goes to transformers' sdpa unchanged.

    Returns (B, W, H, D), as transformers' attention functions do."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, h, w, d = query.shape
    hkv = key.shape[1]
    g = h // hkv
    if (
        attention_mask is None
        or attention_mask.dim() != 4
        or attention_mask.shape[1] != 1
        or g == 1
        or dropout
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    s = key.shape[2]
    q = query.reshape(b, hkv, g * w, d)  # head i·g + j → K/V head i, rows j·W..j·W+W−1
    mask = attention_mask[..., :s][:, :, None].expand(attention_mask.shape[0], 1, g, w, s)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, key, value, attn_mask=mask.reshape(-1, 1, g * w, s), scale=scaling
    )  # (B, H_kv, g·W, D)
    return out.reshape(b, h, w, d).transpose(1, 2).contiguous(), None


def _register_grouped_sdpa() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)


@contextmanager
def native_gqa(*models: Any) -> Iterator[None]:
    """Run the ``models`` whose attention is sdpa under ``grouped_sdpa`` inside the block (transformers' own hook:
    a registered attention implementation), and put sdpa back after it. Eager models, and models whose every query
    head has a K/V head of its own (nothing to fold: the wrapper would only cost a call a layer), are left as they
    are."""
    _register_grouped_sdpa()
    switched = [
        m.config
        for m in models
        if getattr(m.config, "_attn_implementation", None) == "sdpa" and _grouped(m.config)
    ]
    for cfg in switched:
        cfg._attn_implementation = GROUPED_SDPA
    try:
        yield
    finally:
        for cfg in switched:
            cfg._attn_implementation = "sdpa"


def _grouped(config: Any) -> bool:
    """Whether the model shares K/V heads between query heads (grouped-query attention)."""
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    return bool(heads and kv and heads != kv)


def unsupported_reason(config: Any) -> str | None:
    """Why the slot cache cannot serve a model with this config, or None if it can: it serves full and sliding-window
    attention (the window in the mask, ``pass_mask``) under eager or sdpa attention (which apply a float 4D mask)
    with RoPE (or no positional scaling) read from ``position_ids``; hybrid / linear attention, dynamic RoPE scaling
    and attention kernels that take no such mask (flash attention) take today's path."""
    impl = getattr(config, "_attn_implementation", None)
    if impl not in (None, "eager", "sdpa"):
        return f"its attention implementation ({impl}) takes no float mask over the slots (use eager or sdpa)"
    layer_types = getattr(config, "layer_types", None)
    served = ("full_attention", "sliding_attention")
    if layer_types is not None and any(t not in served for t in layer_types):
        kinds = sorted({t for t in layer_types if t not in served})
        return (
            f"it has {', '.join(kinds)} layers (the slot cache serves full and sliding-window attention only)"
        )
    for key in ("rope_scaling", "rope_parameters"):
        rope = getattr(config, key, None)
        if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) in ("dynamic", "longrope"):
            return f"its RoPE scaling ({rope.get('rope_type', rope.get('type'))}) changes with the sequence length"
    return None
