"""What one ``gpu-check`` run does: the shapes it builds, the parts it runs, and their knobs (:class:`CheckConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prove.decode.random_models import SHAPES as REAL_SHAPES

SCHEMA = "prove-gpu-check/1"
ACCEPTANCE_DEFAULT = Path(__file__).parent.parent / "gpu_check_acceptance.json"
"""The tiny demo's per-depth acceptance, shipped next to the recipes (``recipes/gpu_check_acceptance.json``)."""

# The Qwen2.5 sizes from the one table of real shapes (prove.decode.random_models), and tiny CPU stand-ins.
SHAPES: dict[str, dict[str, Any]] = {
    **{name: spec for name, spec in REAL_SHAPES.items() if name.startswith("qwen2.5-")},
    # --tiny: the same roles at CPU size (draft < verifier < targets).
    "tiny-s": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, vocab_size=256, tie_word_embeddings=True),
    "tiny-m": dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=256, tie_word_embeddings=True),
    "tiny-l": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=256, tie_word_embeddings=False),
}  # fmt: skip
PARTS = ("train", "decode", "curve", "engine")
"""The parts a plain run does: torch and transformers are all they need."""
ALL_PARTS = (*PARTS, "pipeline")
"""``--parts pipeline`` too: the whole job through ``make`` (hydra and DeepSpeed, in its subprocesses)."""
PIPELINE_STAGES = ("install", "sft", "mars", "verifier", "cpu-adam", "decode", "bench")


@dataclass
class CheckConfig:
    """What one run does. The defaults are the real (CUDA) check; :func:`tiny_config` is the CPU smoke run."""

    device: str = "cuda"
    out: str = "outputs/gpu-check"
    parts: tuple[str, ...] = PARTS
    seed: int = 0
    tiny: bool = False
    # 1. train
    train_shape: str = "qwen2.5-0.5b"
    train_dtype: str = "bfloat16"
    train_steps: int = 6
    """Optimizer steps per attention path; the first one (FlexAttention's compile) is not timed."""
    train_batch: int = 4
    train_len: int = 512
    """Tokens per example (a multiple of block_size): the model reads 2 × train_len ([noisy | clean])."""
    block_size: int = 8
    flex: bool = True
    dense_attn: str = "sdpa"
    # 2. decode
    decode_shape: str = "qwen2.5-0.5b"
    decode_draft_layers: int = 6
    """The draft of sd / nsd: the decode model's embeddings, first layers and head (an early-exit model)."""
    decode_prompts: int = 6
    decode_new_tokens: int = 64
    decode_std: float = 0.05
    """Weight std of the decode models: larger than the 0.02 init, whose greedy output repeats one token."""
    methods: tuple[str, ...] | None = None
    """Names of :func:`~prove.recipes.gpu_check.decoding.decode_specs` to run; None = all."""
    # 3. curve
    shapes: tuple[str, ...] = ("qwen2.5-0.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-32b")
    draft_shape: str = "qwen2.5-0.5b"
    verifier_shape: str = "qwen2.5-3b"
    widths: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    """The cost curve's widths. A run also times every width its prediction reads outside them (the fused tree
    of the largest K: 287 entries at K = 16; :func:`~prove.recipes.gpu_check.predict.curve_widths`), so no
    predicted row is lost to a width the curve did not reach."""
    cache_len: int = 512
    warmup: int = 3
    repeats: int = 10
    sd_k: int = 5
    acceptance: str | None = None
    """A prove-bench bench.json (or a file in gpu_check_acceptance.json's format); None = the demo's."""
    # 4. engine (prove.recipes.gpu_check.engine): ours against transformers, fast path against reference path
    engine_shapes: tuple[str, ...] = ("qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-32b")
    engine_dtype: str = "bfloat16"
    engine_new_tokens: int = 128
    engine_prompt_len: int = 32
    engine_hf_compile_shapes: tuple[str, ...] = ("qwen2.5-0.5b", "qwen2.5-7b")
    """Shapes that also run transformers' compiled static-cache ``generate`` (its compile took over 140 s at 32B:
    that shape is left out by default, to keep the part within ~4 minutes; add it with --engine-hf-compile)."""
    engine_compile_shapes: tuple[str, ...] = ("qwen2.5-7b",)
    """Shapes that also run our fast rows with ``compile=true`` (the cycle through inductor before its capture): fast
    ar, and fast prove-lossless unfused and fused at the largest injected acceptance; each compiles once. Not yet
    timed on a GPU: on SmolLM2's 30 layers the CPU compiled ar in 22 s and unfused prove-lossless (two passes) in
    42 s, so 32B's 64 layers may take minutes a row; add it with --engine-compile."""
    engine_injected: tuple[float, ...] = (2.0, 3.0, 4.5)
    """Tokens per cycle the injected-acceptance rows run at (each ≤ block_size + 1)."""
    # 5. pipeline (prove.recipes.gpu_check.pipeline): the whole job through make
    pipeline_from: str | None = None
    """``--from-stage``: the first stage to run; the earlier ones are read back from the last run's state.json."""
    pipeline_timeout: float = 600.0
    """Seconds one launch of a stage may take before it is killed and fails."""
    pipeline: dict[str, Any] = field(default_factory=dict)
    """The run's sizes (:func:`~prove.recipes.gpu_check.pipeline.pipeline_settings`; filled from ``tiny``)."""

    def __post_init__(self) -> None:
        unknown = set(self.parts) - set(ALL_PARTS)
        if unknown or not self.parts:
            raise ValueError(f"--parts {','.join(self.parts)}: pick from {','.join(ALL_PARTS)}")
        if self.pipeline_from is not None and self.pipeline_from not in PIPELINE_STAGES:
            raise ValueError(f"--from-stage {self.pipeline_from}: pick from {','.join(PIPELINE_STAGES)}")
        if not self.pipeline:
            from prove.recipes.gpu_check.pipeline import pipeline_settings

            self.pipeline = pipeline_settings(self.tiny)
        for name in {
            self.train_shape,
            self.decode_shape,
            self.draft_shape,
            self.verifier_shape,
            *self.shapes,
            *self.engine_shapes,
            *self.engine_compile_shapes,
        }:
            if name not in SHAPES:
                raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
        if self.train_len % self.block_size:
            raise ValueError(f"train_len={self.train_len} must be a multiple of block_size={self.block_size}")
        if not self.widths or min(self.widths) < 1:
            raise ValueError(f"widths={self.widths}: give positive widths, e.g. 1,2,4,8")
        if any(not 1 <= t <= self.block_size + 1 for t in self.engine_injected):
            raise ValueError(
                f"engine_injected={self.engine_injected}: tokens per cycle lie in [1, block_size + 1]"
            )
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("repeats must be ≥ 1 and warmup ≥ 0")


def tiny_config(**overrides: Any) -> CheckConfig:
    """The CPU smoke run: the same code with tiny shapes, a few steps, a few widths (seconds)."""
    base: dict[str, Any] = dict(
        device="cpu", tiny=True, train_shape="tiny-l", train_dtype="float32", train_steps=2, train_batch=2,
        train_len=16, block_size=4, flex=False, dense_attn="eager", decode_shape="tiny-l", decode_draft_layers=2,
        decode_prompts=2, decode_new_tokens=12, decode_std=0.3, shapes=("tiny-s", "tiny-m", "tiny-l"),
        draft_shape="tiny-s", verifier_shape="tiny-m", widths=(1, 2, 4, 8, 16), cache_len=16, warmup=1, repeats=2,
        engine_shapes=("tiny-l",), engine_dtype="float32", engine_new_tokens=12, engine_prompt_len=6,
        engine_hf_compile_shapes=(), engine_compile_shapes=("tiny-l",),
    )  # fmt: skip
    base.update(overrides)
    return CheckConfig(**base)
