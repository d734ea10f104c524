"""Random-weight models of a real model's exact shape, built in-process (no hub, no download), for timing.

``prove-bench hf_compare=qwen2.5-0.5b`` times our ``ar`` / ``sd`` against transformers' ``generate`` greedy and
assisted generation on a model of Qwen2.5-0.5B's shape; the draft is a layer-skip cut of it (the same
embeddings, final norm and tied output head, and its first ``draft_layers`` decoder layers, shared, not
copied). Random weights decide nothing about speed (the same matmuls run), only which tokens come out, and
the bench checks those are identical between ours and transformers'.

``make gpu-check`` (``prove.recipes.gpu_check``) builds every model it times or trains here too: a shape's
``Qwen2Config`` (:func:`shape_config`), its weights drawn on the device in the dtype it runs in
(:func:`random_model`: a 32B shape never passes through an fp32 copy on the CPU), and the layer-skip draft
(:func:`random_target_and_draft`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_QWEN25 = dict(rope_theta=1000000.0, max_position_embeddings=32768, rms_norm_eps=1e-6)
"""What every Qwen2.5 size shares (q/k/v biases, SwiGLU and RMSNorm come with the Qwen2 architecture)."""

SHAPES: dict[str, dict[str, Any]] = {
    # Qwen2.5's config.json per size, minus the tokenizer ids (no EOS: every request decodes max_new_tokens).
    # prove-bench hf_compare and make gpu-check (prove.recipes.gpu_check) both build from this table.
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True, **_QWEN25),
    "qwen2.5-3b": dict(vocab_size=151936, hidden_size=2048, num_hidden_layers=36, num_attention_heads=16,
                       num_key_value_heads=2, intermediate_size=11008, tie_word_embeddings=True, **_QWEN25),
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, intermediate_size=18944, tie_word_embeddings=False, **_QWEN25),
    "qwen2.5-32b": dict(vocab_size=152064, hidden_size=5120, num_hidden_layers=64, num_attention_heads=40,
                        num_key_value_heads=8, intermediate_size=27648, tie_word_embeddings=False, **_QWEN25),
    # A few-second stand-in with the same structure (GQA, tied embeddings), for tests.
    "tiny": dict(
        vocab_size=512,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
    ),
}  # fmt: skip


def shape_config(
    shape: str | Mapping[str, Any],
    *,
    layers: int | None = None,
    attn: str | None = None,
    pad_token_id: int | None = None,
) -> Any:
    """A ``Qwen2Config`` of a shape: a name in :data:`SHAPES` or a spec of its own (``config.json``'s size fields).

    No BOS / EOS: every request decodes ``max_new_tokens``. ``layers`` replaces the number of decoder layers (a
    layer-skip draft's); ``attn`` sets the attention implementation (``sdpa``, ``eager``, ``flex_attention``;
    None: transformers' default)."""
    from transformers import Qwen2Config

    if isinstance(shape, str):
        if shape not in SHAPES:
            raise ValueError(f"{shape!r} is not a known shape; pick one of: {', '.join(SHAPES)}")
        shape = SHAPES[shape]
    kw: dict[str, Any] = {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, **shape}
    if layers is not None:
        kw["num_hidden_layers"] = layers
    cfg = Qwen2Config(**kw, bos_token_id=None, eos_token_id=None, pad_token_id=pad_token_id, use_cache=True)
    if attn is not None:
        cfg._attn_implementation = attn
    return cfg


def random_model(
    config: Any, device: str = "cpu", dtype: Any = None, *, std: float = 0.02, seed: int = 0
) -> Any:
    """A random-weight causal LM built directly on ``device`` in ``dtype`` (None: float32), in eval mode.

    Matrices are redrawn N(0, std) in ``dtype`` on the device from a generator seeded by ``seed``, in parameter
    order: two models of the same shape and seed are equal, and one with fewer layers has the same embeddings
    and first layers. Norm weights stay 1, biases 0. An untied output head is drawn last, from a generator of
    its own, so it too is the same for any number of layers. (0.02 is the Qwen2 initialiser's std; a larger
    one makes a random model's greedy output vary more.)"""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if dtype is None else dtype
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=getattr(config, "_attn_implementation", None)
        )
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and not name.startswith("lm_head"):
                p.normal_(0.0, std, generator=gen)
        head = model.get_output_embeddings()
        if head is not None and head.weight is not model.get_input_embeddings().weight:
            head.weight.normal_(0.0, std, generator=torch.Generator(device=device).manual_seed(seed + 1))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = config.pad_token_id
    return model.eval()


def param_bytes(config: Any, dtype: Any) -> int:
    """Bytes of a model's parameters, counted on the meta device (no memory used)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return sum(p.numel() for p in model.parameters()) * torch.empty((), dtype=dtype).element_size()


def random_target_and_draft(
    shape: str | Mapping[str, Any],
    draft_layers: int,
    *,
    seed: int = 0,
    dtype: str = "float32",
    device: str = "cpu",
    deep_scale: float = 1.0,
    std: float = 0.02,
) -> tuple[Any, Any]:
    """(target, draft): a random-weight Qwen2 causal LM of a shape (a name in :data:`SHAPES` or a spec; weights by
    :func:`random_model`, on ``device`` in ``dtype``) and a ``draft_layers``-layer draft that shares the target's
    embeddings, first layers, final norm and output head.

    ``deep_scale`` multiplies the output projections (attention ``o_proj``, MLP ``down_proj``) of the layers
    the draft skips: below 1 the skipped layers change the residual stream less, so the draft agrees with the
    target more often, as a trained layer-skip draft does (at 1, random layers make it agree almost never).
    It changes weights only, never the shape or the amount of compute."""
    import torch
    from transformers import Qwen2ForCausalLM

    if isinstance(shape, str) and shape not in SHAPES:
        raise ValueError(f"hf_compare={shape!r} is not a known shape; pick one of: {', '.join(SHAPES)}")
    spec = SHAPES[shape] if isinstance(shape, str) else shape
    name = shape if isinstance(shape, str) else "this"
    if not 1 <= draft_layers < spec["num_hidden_layers"]:
        raise ValueError(
            f"draft_layers={draft_layers} must be between 1 and {spec['num_hidden_layers'] - 1} "
            f"(the {name} shape has {spec['num_hidden_layers']} layers)"
        )
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(
        dtype, torch.float32
    )  # auto: fp32
    target = random_model(shape_config(spec), device, torch_dtype, std=std, seed=seed)
    if deep_scale != 1.0:
        with torch.no_grad():
            for layer in target.model.layers[draft_layers:]:
                layer.self_attn.o_proj.weight.mul_(deep_scale)
                layer.mlp.down_proj.weight.mul_(deep_scale)
    with torch.device("meta"):  # no second random init: every weight is the target's
        draft = Qwen2ForCausalLM(shape_config(spec, layers=draft_layers))
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.layers = torch.nn.ModuleList(target.model.layers[:draft_layers])
    draft.model.norm = target.model.norm
    draft.lm_head = target.lm_head
    draft.model.rotary_emb = target.model.rotary_emb
    draft.generation_config.eos_token_id = None
    draft.generation_config.pad_token_id = None
    return target, draft.eval()


def random_prompts(n: int, length: int, vocab_size: int, *, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of ``length`` uniformly random token ids (timing needs no text)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (length,), generator=g).tolist() for _ in range(n)]
