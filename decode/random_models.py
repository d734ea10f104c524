"""Random-weight models of a real model's exact shape, built in-process (no hub, no download), for timing.

``prove-bench hf_compare=qwen2.5-0.5b`` times our ``ar`` / ``sd`` against transformers' ``generate`` greedy and
assisted generation on a model of Qwen2.5-0.5B's shape; the draft is a layer-skip cut of it (the same
embeddings, final norm and tied output head, and its first ``draft_layers`` decoder layers, shared, not
copied). Random weights decide nothing about speed (the same matmuls run), only which tokens come out, and
the bench checks those are identical between ours and transformers'.
"""

from __future__ import annotations

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


def random_target_and_draft(
    shape: str,
    draft_layers: int,
    *,
    seed: int = 0,
    dtype: str = "float32",
    device: str = "cpu",
    deep_scale: float = 1.0,
) -> tuple[Any, Any]:
    """(target, draft): a random-weight Qwen2 causal LM of ``SHAPES[shape]`` and a ``draft_layers``-layer
    draft that shares the target's embeddings, first layers, final norm and output head.

    ``deep_scale`` multiplies the output projections (attention ``o_proj``, MLP ``down_proj``) of the layers
    the draft skips: below 1 the skipped layers change the residual stream less, so the draft agrees with the
    target more often, as a trained layer-skip draft does (at 1, random layers make it agree almost never).
    It changes weights only, never the shape or the amount of compute."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"hf_compare={shape!r} is not a known shape; pick one of: {', '.join(SHAPES)}")
    spec = SHAPES[shape]
    if not 1 <= draft_layers < spec["num_hidden_layers"]:
        raise ValueError(
            f"draft_layers={draft_layers} must be between 1 and {spec['num_hidden_layers'] - 1} "
            f"(the {shape} shape has {spec['num_hidden_layers']} layers)"
        )
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(
        dtype, torch.float32
    )  # auto: fp32
    common: dict[str, Any] = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None, use_cache=True)
    torch.manual_seed(seed)
    target = Qwen2ForCausalLM(Qwen2Config(**spec, **common))
    if deep_scale != 1.0:
        with torch.no_grad():
            for layer in target.model.layers[draft_layers:]:
                layer.self_attn.o_proj.weight.mul_(deep_scale)
                layer.mlp.down_proj.weight.mul_(deep_scale)
    draft_cfg = Qwen2Config(**{**spec, "num_hidden_layers": draft_layers}, **common)
    with torch.device("meta"):  # no second random init: every weight is the target's
        draft = Qwen2ForCausalLM(draft_cfg)
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.layers = torch.nn.ModuleList(target.model.layers[:draft_layers])
    draft.model.norm = target.model.norm
    draft.lm_head = target.lm_head
    draft.model.rotary_emb = target.model.rotary_emb
    for model in (target, draft):
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = None
    target = target.to(device=device, dtype=torch_dtype).eval()  # type: ignore[call-arg]
    return target, draft.eval()


def random_prompts(n: int, length: int, vocab_size: int, *, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of ``length`` uniformly random token ids (timing needs no text)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (length,), generator=g).tolist() for _ in range(n)]
