"""The slot cache checked on a model (docs/design.md §3): ``self_check`` against the model's own cacheless pass, run
when a Decoder is built, and remembered on this machine per model and version (``checked``)."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import torch
from prove.decode.engine.cache import SlotCache, linear_see, pass_mask
from transformers import DynamicCache

CHECKS_FILE = "slot-cache-checks.json"
"""Where ``checked`` remembers the models that passed ``self_check``: in ``PROVE_CACHE_DIR``, else
``$XDG_CACHE_HOME/prove``, else ``~/.cache/prove``."""


def _checks_path() -> Path:
    root = os.environ.get("PROVE_CACHE_DIR") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "prove"
    )
    return Path(root) / CHECKS_FILE


def check_key(model: Any) -> str:
    """What a passed self-check holds for: the model's class and config (its path aside), dtype, device type and
    attention, the torch and transformers versions, and the source of the slot cache, the runner and this module."""
    import hashlib
    import json

    import transformers
    from prove.decode.engine import cache, runner

    config = {
        k: v for k, v in model.config.to_dict().items() if k not in ("_name_or_path", "transformers_version")
    }
    p = next(model.parameters())
    parts = {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "config": config,
        "attn": getattr(model.config, "_attn_implementation", None),
        "dtype": str(p.dtype),
        "device": p.device.type,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "code": [Path(f).read_text() for f in (cache.__file__, runner.__file__, __file__)],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def checked(model: Any) -> str | None:
    """``self_check``, remembered on this machine: a model whose ``check_key`` passed once is not checked again (the
    check costs a few passes of the model each time a Decoder is built: ~0.5 s of SmolLM2 on a 2-core CPU). A
    failure is never remembered; an unreadable or torn file is a miss."""
    import json

    path = _checks_path()
    key = check_key(model)
    try:
        passed = set(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        passed = set()
    if key in passed:
        return None
    reason = self_check(model)
    if reason is None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(sorted(passed | {key})))
            tmp.replace(path)  # whole or not at all
        except OSError:
            pass  # a read-only home: the check runs again next time
    return reason


def self_check(model: Any, *, tokens: int = 6, atol: float | None = None) -> str | None:
    """The slot cache against the model without a cache on a short pass (a prefill, then a pass after a rejected
    one; outside fp32 ``DynamicCache`` too, to measure how far correct passes lie apart): None if their logits
    agree, else a one-line reason. transformers may change its cache
    interface between the 5.x releases this project allows; this catches it when a Decoder is built."""
    dtype = next(model.parameters()).dtype
    try:
        ids = _probe_ids(model, 2 * tokens)
        with torch.no_grad():
            whole, ref_a, ref_b = _reference_logits(model, ids, tokens)
            got_a, got_b = _slot_cache_logits(model, ids, tokens)
    except Exception as err:  # noqa: BLE001 - any failure means: use the composed cycle
        return f"the slot cache failed on this model ({type(err).__name__}: {err})"
    scale = max(float(ref_a.abs().max()), 1.0)

    def gap(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.float() - b.float()).abs().max()) / scale

    # how far two correct passes of other widths (other kernels) lie apart in this dtype (DynamicCache's against
    # the cacheless pass's) — in bf16 at 32B that alone is several percent of the logits' scale; 0 in fp32
    noise = max(gap(whole[:tokens], ref_a), gap(whole[tokens:], ref_b))
    floor = 1e-3 if dtype == torch.float32 else 5e-2
    tol = atol if atol is not None else max(floor, 4 * noise)
    diff = max(gap(got_a, ref_a), gap(got_b, ref_b))
    if not diff <= tol:
        return (
            f"the slot cache's logits differ from the model's own (no cache) by {diff:.2e} (relative), over "
            f"{tol:.2e} allowed (4x the {noise:.2e} two correct passes differ by in {str(dtype).split('.')[-1]})"
        )
    return None


def _probe_ids(model: Any, n: int) -> torch.Tensor:
    """``n`` random ids of the model's vocabulary (seeded: every check feeds the same), on its device."""
    head = model.get_output_embeddings()
    V = head.weight.shape[0] if head is not None else int(model.config.vocab_size)
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, V, (n,), generator=g).to(next(model.parameters()).device)


def _reference_logits(
    model: Any, ids: torch.Tensor, tokens: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The cacheless pass over ``ids``, and its two halves of ``tokens`` as correct cached passes give them: in fp32
    the cacheless rows themselves (two correct passes of other widths agree to ~1e-6 there: no need to measure),
    else ``DynamicCache``'s prefill and next pass."""
    whole = model(input_ids=ids[None], use_cache=False).logits[0]  # the logits without a cache
    if next(model.parameters()).dtype == torch.float32:
        return whole, whole[:tokens], whole[tokens:]
    dyn = DynamicCache(config=model.config)
    ref_a = model(input_ids=ids[None, :tokens], past_key_values=dyn, use_cache=True).logits[0]
    ref_b = model(
        input_ids=ids[None, tokens:],
        position_ids=torch.arange(tokens, 2 * tokens, device=ids.device)[None],
        past_key_values=dyn,
        use_cache=True,
    ).logits[0]
    return whole, ref_a, ref_b


def _slot_cache_logits(model: Any, ids: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same two halves through a slot cache, with a rejected pass between them: its stale slots past the valid
    length must stay out of the second half's view."""
    cache = SlotCache.for_model(model, 4 * tokens)
    got_a = _slot_pass(model, cache, ids[:tokens], 0)
    _slot_pass(model, cache, ids.flip(0)[:tokens], tokens)  # the pass that gets rejected
    got_b = _slot_pass(model, cache, ids[tokens:], tokens)
    return got_a, got_b


def _slot_pass(model: Any, cache: SlotCache, chunk: torch.Tensor, start: int) -> torch.Tensor:
    """The logits of a linear pass of ``chunk`` at positions ``start``.. through ``cache``, masked and called as the
    engine calls the model."""
    pos = torch.arange(start, start + chunk.shape[0], device=chunk.device)
    cache.set_slots(pos)
    dtype = next(model.parameters()).dtype
    mask = pass_mask(model.config, linear_see(pos[0], chunk.shape[0], cache.capacity), pos, dtype)
    takes_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
    keep = {"logits_to_keep": chunk.shape[0]} if takes_keep else {}  # as the engine calls it
    return model(
        input_ids=chunk[None],
        position_ids=pos[None],
        past_key_values=cache,
        attention_mask=mask,
        use_cache=True,
        **keep,
    ).logits[0]
